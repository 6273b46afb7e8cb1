// The daemon's HTTP API with the user's bearer token. A 401 opens the token dialog and retries
// with what the user enters; the token lives in this tab's sessionStorage only.

const TOKEN_KEY = "delayd.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function currentToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

let asking = null; // one prompt for every request that got a 401 meanwhile

export function askToken(problem) {
  if (asking) return asking;
  const dialog = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  const error = document.getElementById("token-error");
  error.hidden = !problem;
  error.textContent = problem || "";
  input.value = "";
  asking = new Promise((resolve) => {
    const done = (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      form.removeEventListener("submit", done);
      dialog.close();
      asking = null;
      resolve(value);
    };
    form.addEventListener("submit", done);
  });
  if (!dialog.open) dialog.showModal();
  input.focus();
  return asking;
}

export async function api(method, path, body) {
  for (;;) {
    const token = currentToken();
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, "unreachable", `the daemon did not answer (${e.message})`);
    }
    const data = await response.json().catch(() => null);
    if (response.status === 401) {
      // Sent before the user entered a (new) token: simply retry with it.
      if (token === currentToken() || asking) {
        await askToken(token ? "The daemon refused that token." : null);
      }
      continue;
    }
    if (!response.ok) {
      const err = (data && data.error) || {};
      throw new ApiError(response.status, err.code || `http_${response.status}`, err.message || response.statusText);
    }
    return data;
  }
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

export const seg = encodeURIComponent;
