// Formatting of times, durations, sizes and counts for the console.

const pad = (n, w = 2) => String(n).padStart(w, "0");

export function fmtTime(ms, withMs = false) {
  if (ms === null || ms === undefined) return "–";
  const d = new Date(ms);
  const s = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return withMs ? `${s}.${pad(d.getMilliseconds(), 3)}` : s;
}

const UNITS = [["y", 31536000000], ["d", 86400000], ["h", 3600000], ["m", 60000], ["s", 1000]];

export function fmtDuration(ms) {
  let left = Math.abs(Math.round(ms));
  if (left < 1000) return `${left}ms`;
  const parts = [];
  for (const [name, size] of UNITS) {
    if (left >= size) {
      parts.push(`${Math.floor(left / size)}${name}`);
      left %= size;
    }
    if (parts.length === 2) break;
  }
  return parts.join(" ");
}

export function fmtRelative(ms, now = Date.now()) {
  const delta = ms - now;
  if (Math.abs(delta) < 1000) return "now";
  return delta > 0 ? `in ${fmtDuration(delta)}` : `${fmtDuration(delta)} ago`;
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(i === 0 || v >= 100 ? 0 : 1)} ${units[i]}`;
}

export function fmtCount(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US");
}

export function fmtRate(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  return n >= 100 ? fmtCount(Math.round(n)) : n.toFixed(1);
}

// Tick labels: as precise as the visible span needs.
export function fmtTick(ms, spanMs) {
  const d = new Date(ms);
  if (spanMs > 2 * 31536000000) return `${d.getFullYear()}`;
  if (spanMs > 60 * 86400000) return `${d.getFullYear()}-${pad(d.getMonth() + 1)}`;
  if (spanMs > 2 * 86400000) return `${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  if (spanMs > 10 * 60000) return `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  if (spanMs > 10000) return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return `${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// A local datetime-local input value <-> epoch ms.
export function toLocalInput(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function fromLocalInput(value) {
  const ms = new Date(value).getTime();
  return Number.isFinite(ms) ? ms : null;
}
