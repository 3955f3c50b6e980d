// A rollout's page, built from the page's data for the #r-N in the address; data goes in
// through textContent only, never parsed as HTML.
const { texts, pages } = JSON.parse(document.getElementById("data").textContent);
const sep = Object.keys(texts).length ? "" : " ", text = (id) => texts[id] ?? String(id);
const el = (tag, cls, text, parent) => { const e = document.createElement(tag);
  if (cls) e.className = cls; if (text !== undefined) e.textContent = text; parent.appendChild(e); return e; };
function show() {
  const n = /^#r-(\d+)$/.exec(location.hash), p = n && pages[n[1] - 1];
  document.querySelector("section.rollout")?.remove();
  document.body.classList.toggle("page", !!p);
  if (!p) return;
  const s = el("section", "rollout", undefined, document.querySelector("main"));
  s.id = location.hash.slice(1);
  el("a", "", "\u2190 all rollouts", el("p", "", undefined, s)).href = "#inputs";
  el("span", "o-" + p.outcome, p.outcome, el("h2", "", p.key + " ", s));
  el("p", "", p.head, s);
  if (p.failure) el("p", "o-failed", p.failure, s);
  el("h3", "", "Transcript (as the agent saw it)", s);
  const tr = el("div", "transcript", undefined, s);
  for (const [role, text, calls] of p.messages) { const m = el("div", "msg " + role, undefined, tr);
    el("b", "", role, m); if (text) el("pre", "", text, m); calls.forEach((c) => el("pre", "call", "\u2192 " + c, m)); }
  if (!p.messages.length) el("p", "", "no transcript recorded", tr);
  el("h3", "", "Tokens (as the trainer will see them)", s);
  for (const seg of p.segments) { const d = el("div", "segment", undefined, s); el("p", "", seg.head, d);
    const t = el("div", "tokens", undefined, d);
    for (const [mask, run] of seg.runs) {
      if (!mask) el("span", "m0", run.map(text).join(sep), t).title = "prompt / tool tokens (loss mask 0)";
      else for (const [id, lp, v] of run) { el("span", "m1", text(id), t).title =
        `id ${id} \u00b7 logprob ${lp.toFixed(4)}` + (v >= 0 ? ` \u00b7 policy v${v}` : ""); t.append(sep); }
      t.append(sep);
    } }
  if (!p.segments.length) el("p", "", "no tokens captured (run through a gateway to capture them)", s);
  if (p.traceback) { el("h3", "", "Traceback", s); el("pre", "", p.traceback, s); }
  el("h3", "", "Envelope", s); el("pre", "envelope", JSON.stringify(p.envelope, null, 2), s);
  scrollTo(0, 0);
}
addEventListener("hashchange", show);
show();
