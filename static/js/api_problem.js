// Shared by the pages that call the REST API from JavaScript (live.js, timeline.js).

// An API error as one sentence: its detail, then each field's problems ("thought: Ensure this field has …").
export function problem(reply, status) {
  const errors = reply.errors;
  let details = "";
  if (Array.isArray(errors)) {
    details = errors.map((e) => (typeof e === "string" ? e : e.message || JSON.stringify(e))).join("; ");
  } else if (errors && typeof errors === "object") {
    details = Object.entries(errors).map(([field, messages]) => `${field}: ${[].concat(messages).join(" ")}`).join("; ");
  }
  return (reply.detail || `HTTP ${status}`) + (details ? " " + details : "");
}
