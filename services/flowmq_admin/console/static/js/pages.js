// The shapes the console's pages share: a tab that lists one kind of thing (a heading, what
// comes before the table, the table refreshed with the live counts), the heading of one
// thing's own page, and the actions that change something and then refresh the page.

import { attempt, button, el, form, link, notify, table } from "./dom.js";

// The query of a call within the namespace picked in the header.
export const ns = (ctx) => ({ namespace: ctx.namespace() });

// listPage({id, title, heading, empty, key}, build): the tab #/<id>. build(ctx, refresh) gives
// {intro: the nodes between the heading and the table (a create form, a hint), load(): the
// rows, columns: the table's (see dom.table)}; the table stands in #<id>-list.
export function listPage({ id, title, heading = title, empty, key }, build) {
  return {
    id,
    title,
    mount(view, ctx) {
      const list = el("div", { id: `${id}-list` });
      const { intro = [], load, columns } = build(ctx, refresh);
      view.append(el("h2", {}, heading), ...intro, list);
      async function refresh() {
        list.replaceChildren(table(columns, await load(), { empty, key }));
      }
      return { refresh };
    },
  };
}

// detailPage(tab, kind, build): the page #/<tab>/<name> of one thing: a heading with the way
// back to its tab, a summary line (#<kind>-summary) and what build(ctx, name, summary) gives:
// {nodes: the rest of the page, refresh}.
export function detailPage(tab, kind, build) {
  return {
    id: tab,
    title: kind,
    mount(view, ctx, name) {
      const summary = el("p", { id: `${kind.toLowerCase()}-summary`, class: "summary" });
      const { nodes, refresh } = build(ctx, name, summary);
      view.append(
        el("h2", {}, `${kind} `, el("span", { class: "name" }, name), " ",
          link(`#/${tab}`, `(all ${tab})`)),
        summary, ...nodes,
      );
      return { refresh };
    },
  };
}

// A form (see dom.form) whose submit runs change(values, controls), shows the notice it
// returns and refreshes the page with after(); an error goes to the banner.
export function changeForm(id, fields, submitLabel, change, after) {
  return form(id, fields, submitLabel, (values, controls) => attempt(async () => {
    notify(await change(values, controls));
    await after();
  }));
}

// A danger button that asks `question` first; then as changeForm.
export function confirmButton(text, question, change, after) {
  return button(text, () => attempt(async () => {
    if (!window.confirm(question)) return;
    notify(await change());
    await after();
  }), "danger");
}
