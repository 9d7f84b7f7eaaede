// Submit: kind, display name, GPU count and the Fireworks payload as JSON. The API validates;
// its 400 answers list every problem at once, each naming where (details: [{field?, path,
// message}]: the field, or a path such as fireworks_payload.epochs), and every message is shown
// beside its field. Only the payload's JSON syntax is checked here, since a
// payload that does not parse cannot be sent as an object at all.

import {ApiError} from "./api.js";
import {h, jobHref, randomKey} from "./dom.js";

const FIELDS = ["kind", "display_name", "gpu_count", "fireworks_payload"];
const EXAMPLE = `{
  "baseModel": "accounts/fireworks/models/qwen3-14b",
  "dataset": "accounts/<account>/datasets/<dataset>",
  "outputModel": "accounts/<account>/models/<name>",
  "epochs": 1
}`;

export function mount(ctx) {
  const {api, main, navigate} = ctx;
  const inputs = {
    kind: h("select", {id: "f-kind", "aria-describedby": "err-kind"},
      ["SFT", "DPO", "RFT"].map((k) => h("option", {value: k}, k))),
    display_name: h("input", {id: "f-display_name", type: "text", autocomplete: "off",
      "aria-describedby": "help-display_name err-display_name"}),
    gpu_count: h("input", {id: "f-gpu_count", type: "number", inputmode: "numeric", min: "1",
      max: "64", step: "1", value: "4", "aria-describedby": "help-gpu_count err-gpu_count"}),
    fireworks_payload: h("textarea", {id: "f-fireworks_payload", rows: "10", spellcheck: "false",
      autocapitalize: "off", placeholder: EXAMPLE,
      "aria-describedby": "help-fireworks_payload err-fireworks_payload"}),
  };
  const errors = Object.fromEntries(FIELDS.map((f) => [f,
    h("div", {id: `err-${f}`, class: "field-error"})]));
  const summary = h("div", {id: "submit-summary", role: "alert", tabindex: "-1"});
  const button = h("button", {type: "submit", class: "primary", id: "submit-job"}, "Submit job");

  const fieldBlock = (name, label, help) => h("div", {class: "field"},
    h("label", {for: inputs[name].id}, label), inputs[name],
    help ? h("p", {id: `help-${name}`, class: "help muted"}, help) : null, errors[name]);

  const form = h("form", {class: "card submit", novalidate: true, "aria-labelledby": "submit-h"},
    h("h1", {id: "submit-h", tabindex: "-1"}, "Submit a job"),
    h("p", {class: "muted"}, "The job joins the back of the queue; the scheduler admits it when ",
      "its turn comes and the GPU quota has room."),
    summary,
    fieldBlock("kind", "Kind"),
    fieldBlock("display_name", "Display name", "Optional: a name to recognise it by. Left empty, the payload's displayName is used."),
    fieldBlock("gpu_count", "GPU count", "How many GPUs the job will use (1 to 64)."),
    fieldBlock("fireworks_payload", "Fireworks payload (JSON)",
      "The body you would send to Fireworks to create the job, as a JSON object."),
    h("div", {class: "actions"}, button));
  main.append(form);

  function clearErrors() {
    summary.replaceChildren();
    for (const f of FIELDS) {
      errors[f].replaceChildren();
      inputs[f].removeAttribute("aria-invalid");
    }
  }

  /** byField: field -> a message or a list of messages, each shown under its field. */
  function showErrors(byField, general) {
    const named = Object.keys(byField).filter((f) => FIELDS.includes(f));
    let count = 0;
    for (const f of named) {
      const messages = [].concat(byField[f]);
      count += messages.length;
      errors[f].replaceChildren(messages.length === 1 ? messages[0]
        : h("ul", {}, messages.map((m) => h("li", {}, m))));
      inputs[f].setAttribute("aria-invalid", "true");
    }
    const lines = [];
    if (general) lines.push(general);
    if (count) {
      lines.push(count === 1 ? "One problem needs fixing; the message is beside its field."
        : `${count} problems need fixing; each message is beside its field.`);
    }
    summary.replaceChildren(...lines.map((t) => h("p", {class: "notice notice-error"}, t)));
    if (named.length) inputs[named[0]].focus();
    else summary.focus();
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    const body = {kind: inputs.kind.value};
    const name = inputs.display_name.value;
    body.display_name = name === "" ? null : name;
    const gpus = inputs.gpu_count.value.trim();
    // Whatever was typed goes to the API, which says what is wrong with it.
    body.gpu_count = /^-?\d+$/.test(gpus) ? Number(gpus) : gpus;
    const text = inputs.fireworks_payload.value.trim();
    if (text === "") {
      showErrors({fireworks_payload: "Enter the payload: a JSON object."});
      return;
    }
    try {
      body.fireworks_payload = JSON.parse(text);
    } catch (err) {
      showErrors({fireworks_payload: `This is not valid JSON: ${err.message}`});
      return;
    }
    button.disabled = true;
    try {
      const resp = await api.request("POST", "jobs", {body,
        headers: {"Idempotency-Key": randomKey()}});
      const href = jobHref(resp.data.id);
      if (href) navigate(href);
    } catch (err) {
      if (err.status === 401) return;
      if (!(err instanceof ApiError)) throw err;
      const byField = {};
      if (Array.isArray(err.details)) {
        for (const d of err.details) {
          if (!d || typeof d.message !== "string") continue;
          // The field it concerns: named, or the first step of its path
          // (fireworks_payload.trainingConfig.epochs is the payload's).
          const where = typeof d.field === "string" ? d.field
            : typeof d.path === "string" ? d.path.split(/[.[]/, 1)[0] : "";
          if (FIELDS.includes(where)) (byField[where] ||= []).push(d.message);
        }
      }
      if (err.code === "missing_payload") byField.fireworks_payload = [err.message];
      const general = Object.keys(byField).length ? null
        : `The job was not submitted: ${err.message}`;
      showErrors(byField, general);
    } finally {
      button.disabled = false;
    }
  });

  return {refresh() {}, onFrame() {}};
}
