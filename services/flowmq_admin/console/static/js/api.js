// The admin API as the console uses it: every call sends the admin token as a Bearer token
// and unwraps the {"success", "data", "error"} envelope; an error answer becomes an ApiError
// carrying the envelope's code and message. The token lives in sessionStorage (this tab
// only) from sign-in to sign-out.

const TOKEN_KEY = "flowmq.token";
export const API = "/api/v1";

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }

  // "code: message" and, for schema failures, each problem with its field.
  describe() {
    const problems = (this.details && this.details.problems) || [];
    const extra = problems.map((p) => (p.field ? `${p.field}: ${p.message}` : `${p.message}`));
    return [`${this.code}: ${this.message}`, ...extra].join("\n");
  }
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

// Called with the ApiError when the API refuses the token (set by main.js: back to sign-in).
let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

// One path segment or a multi-level name ({topic}, {username}, {id}): '/' is percent-encoded,
// which the API accepts as the same name.
export const segment = (name) => encodeURIComponent(name);

// call("GET", "/streams", {query: {namespace: "default"}}) -> the envelope's data.
export async function call(method, path, { query, body, tokenValue } = {}) {
  const url = new URL(API + path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Authorization: `Bearer ${tokenValue ?? token.get() ?? ""}` };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    throw new ApiError(0, "unreachable", `the broker did not answer (${err.message})`);
  }
  let envelope = null;
  try {
    envelope = await response.json();
  } catch {
    // Not JSON: a proxy's error page or a broker without the admin role.
  }
  if (envelope && envelope.success === true) return envelope.data;
  const error = (envelope && envelope.error) || {};
  const failure = new ApiError(
    response.status,
    error.code || `http_${response.status}`,
    error.message || response.statusText || "request failed",
    error.details,
  );
  if (response.status === 401 && tokenValue === undefined) onUnauthorized(failure);
  throw failure;
}

// The Prometheus exposition (no token needed, but it does no harm to send none).
export async function metricsText() {
  const response = await fetch("/metrics", { cache: "no-store" });
  if (!response.ok) throw new ApiError(response.status, "metrics", `/metrics: ${response.status}`);
  return response.text();
}
