// The due-time histogram: GET /v1/schedule drawn as SVG bars, zoomable from years to seconds.
// Wheel or +/- zooms around the pointer, dragging or the arrow keys pan, a click on a bar lists
// its messages, a double click zooms into it.

import { fmtCount, fmtDuration, fmtTick, fmtTime } from "./format.js";

const SVG = "http://www.w3.org/2000/svg";
const MIN_SPAN = 1000;
const MAX_SPAN = 20 * 31536000000;
const HEIGHT = 200;
const PAD = { left: 56, right: 8, top: 10, bottom: 24 };
const BAR_PX = 7; // target width of one bucket
const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;
const NICE_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, SECOND, 2 * SECOND, 5 * SECOND, 10 * SECOND, 15 * SECOND,
  30 * SECOND, MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE, HOUR, 2 * HOUR, 3 * HOUR,
  6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY, 14 * DAY, 30 * DAY, 61 * DAY, 91 * DAY, 182 * DAY, 365 * DAY,
  730 * DAY, 1826 * DAY];

function el(name, attrs = {}, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

export class Histogram {
  constructor(container, { load, onPick, onChange }) {
    this.box = container;
    this.load = load; // (from, to, step) -> Promise<[[start, count], ...]>
    this.onPick = onPick; // (from, to) a bucket was clicked
    this.onChange = onChange; // (caption text) after each draw
    this.from = 0;
    this.to = 0;
    this.buckets = [];
    this.step = 1;
    this.generation = 0;
    this.timer = null;
    this.setSpan(86400000);
    container.addEventListener("wheel", (e) => this.wheel(e), { passive: false });
    container.addEventListener("pointerdown", (e) => this.drag(e));
    container.addEventListener("keydown", (e) => this.key(e));
    window.addEventListener("resize", () => this.draw());
  }

  get span() {
    return this.to - this.from;
  }

  setSpan(span, center) {
    span = Math.min(MAX_SPAN, Math.max(MIN_SPAN, span));
    if (center === undefined) {
      this.from = Date.now() - Math.round(span * 0.05); // a little of the past: overdue messages
    } else {
      this.from = Math.round(center - span / 2);
    }
    this.to = this.from + span;
    this.later();
  }

  zoom(factor, atMs) {
    const span = Math.min(MAX_SPAN, Math.max(MIN_SPAN, this.span * factor));
    const at = atMs === undefined ? this.from + this.span / 2 : atMs;
    const share = (at - this.from) / this.span;
    this.from = Math.round(at - share * span);
    this.to = this.from + Math.round(span);
    this.later();
  }

  pan(fraction) {
    const d = Math.round(this.span * fraction);
    this.from += d;
    this.to += d;
    this.later();
  }

  // Coalesce the requests of a gesture into one.
  later(delayMs = 120) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(), delayMs);
  }

  buckets_wanted() {
    const width = Math.max(200, this.box.clientWidth - PAD.left - PAD.right);
    return Math.max(20, Math.min(240, Math.floor(width / BAR_PX)));
  }

  async refresh() {
    const n = this.buckets_wanted();
    // /v1/schedule counts whole timer slots (1 s by default) in the bucket their start falls in:
    // buckets of whole seconds start on slot boundaries, so a bar holds exactly what a listing of
    // its range shows.
    const raw = Math.max(1, Math.ceil(this.span / n));
    const step = raw >= 1000 ? Math.ceil(raw / 1000) * 1000 : raw;
    const from = Math.floor(this.from / step) * step;
    const to = from + n * step;
    const generation = ++this.generation;
    try {
      const buckets = await this.load(from, to, step);
      if (generation !== this.generation) return; // a newer view was asked for meanwhile
      this.buckets = buckets;
      this.step = step;
      this.view = { from, to };
      this.error = null;
    } catch (e) {
      if (generation !== this.generation) return;
      this.error = e.message;
    }
    this.draw();
  }

  draw() {
    this.box.replaceChildren();
    const width = Math.max(260, this.box.clientWidth);
    const svg = el("svg", { width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, role: "img" });
    this.box.append(svg);
    if (this.error) {
      svg.append(el("text", { x: PAD.left, y: HEIGHT / 2, class: "axis" }, this.error));
      this.onChange(this.error);
      return;
    }
    if (!this.view) return;
    const { from, to } = this.view;
    const plotW = width - PAD.left - PAD.right;
    const plotH = HEIGHT - PAD.top - PAD.bottom;
    const max = Math.max(1, ...this.buckets.map((b) => b[1]));
    const x = (t) => PAD.left + ((t - from) / (to - from)) * plotW;
    // grid and y labels (whole counts only)
    for (const value of max >= 2 ? [0, Math.round(max / 2), max] : [0, max]) {
      const y = PAD.top + plotH * (1 - value / max);
      svg.append(el("line", { x1: PAD.left, x2: width - PAD.right, y1: y, y2: y, class: "grid" }));
      svg.append(el("text", { x: PAD.left - 6, y: y + 4, class: "axis", "text-anchor": "end" }, fmtCount(value)));
    }
    // x ticks at round times: the nice step that gives about six of them
    const tickStep = NICE_STEPS.find((n) => (to - from) / n <= 7) || NICE_STEPS[NICE_STEPS.length - 1];
    const offset = new Date(from).getTimezoneOffset() * 60000; // round in local time
    for (let t = Math.ceil((from - offset) / tickStep) * tickStep + offset; t <= to; t += tickStep) {
      const tx = x(t);
      svg.append(el("line", { x1: tx, x2: tx, y1: PAD.top + plotH, y2: PAD.top + plotH + 4, class: "tick" }));
      svg.append(el("text", { x: tx, y: HEIGHT - 6, class: "axis", "text-anchor": "middle" },
        fmtTick(t, to - from)));
    }
    // bars
    const bw = Math.max(1, (plotW * this.step) / (to - from) - 1);
    let total = 0;
    for (const [start, count] of this.buckets) {
      total += count;
      if (!count) continue;
      const h = Math.max(2, (count / max) * plotH);
      const bar = el("rect", { x: x(start), y: PAD.top + plotH - h, width: bw, height: h, class: "bar",
        "data-start": start, "data-count": count });
      bar.append(el("title", {}, `${fmtCount(count)} due ${fmtTime(start, this.step < 1000)} – ` +
        `${fmtTime(start + this.step, this.step < 1000)}\nclick: list them · double click: zoom in`));
      bar.addEventListener("click", (e) => {
        e.stopPropagation();
        if (this.dragged) return;
        this.onPick(start, start + this.step - 1);
      });
      bar.addEventListener("dblclick", (e) => {
        e.stopPropagation();
        this.setSpan(Math.max(MIN_SPAN, this.step), start + this.step / 2);
      });
      svg.append(bar);
    }
    const now = Date.now();
    if (now >= from && now <= to) {
      svg.append(el("line", { x1: x(now), x2: x(now), y1: PAD.top, y2: PAD.top + plotH, class: "now" }));
      svg.append(el("text", { x: x(now) + 3, y: PAD.top + 10, class: "axis now-label" }, "now"));
    }
    this.onChange(`${fmtCount(total)} pending due ${fmtTime(from)} → ${fmtTime(to)} · ` +
      `${fmtDuration(this.step)} per bar`);
  }

  timeAt(clientX) {
    const r = this.box.getBoundingClientRect();
    const plotW = r.width - PAD.left - PAD.right;
    const share = Math.min(1, Math.max(0, (clientX - r.left - PAD.left) / plotW));
    return this.from + share * this.span;
  }

  wheel(e) {
    e.preventDefault();
    this.zoom(e.deltaY > 0 ? 1.5 : 1 / 1.5, this.timeAt(e.clientX));
  }

  drag(e) {
    if (e.button !== 0) return;
    const startX = e.clientX;
    const from = this.from;
    const span = this.span;
    const plotW = Math.max(1, this.box.clientWidth - PAD.left - PAD.right);
    this.dragged = false;
    const move = (ev) => {
      const dx = ev.clientX - startX;
      if (Math.abs(dx) > 3) this.dragged = true;
      if (!this.dragged) return;
      this.from = from - Math.round((dx / plotW) * span);
      this.to = this.from + span;
      this.later(60);
    };
    const up = () => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      setTimeout(() => { this.dragged = false; }, 0);
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  key(e) {
    const actions = { "+": () => this.zoom(1 / 2), "=": () => this.zoom(1 / 2), "-": () => this.zoom(2),
      ArrowLeft: () => this.pan(-0.25), ArrowRight: () => this.pan(0.25) };
    const act = actions[e.key];
    if (act) {
      e.preventDefault();
      act();
    }
  }
}
