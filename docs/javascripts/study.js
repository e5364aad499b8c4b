/*
 * Study tools for the question bank: filters, a random drill, keyboard shortcuts.
 *
 * Works beside practice.js and reads the same localStorage state, so a drill
 * favours what the reader marked shaky or missed:
 *   llm-bank.marks   {"part-0/<slug>": "knew" | "shaky" | "missed"}   (practice.js writes it)
 *   llm-bank.filter  {kinds: [...], part: "part-5" | ""}               (this file)
 *   llm-bank.drill   {root, ids}                                       (this file: a drill in progress)
 *
 * The build (docs/.hooks/bank_render.py) marks up:
 *   div.bank-study[data-root][data-questions]  bank index: filter bar and drill; data-questions is
 *                                              JSON [{id, kind, part}] for every question
 *   table rows whose first link is a question  hidden by a filter (class added here)
 *   div.bank-practice--bar[data-question]      question page: where the drill bar goes
 * Without JavaScript the slot stays empty and every question stays listed.
 *
 * Material's instant navigation swaps pages without reloading scripts, so all
 * work starts from `document$`, and the keyboard listener is installed once.
 */
(function () {
  "use strict";

  var KEY = "llm-bank.";
  // How much more likely a drill is to pick a question, by its mark.
  var WEIGHT = { missed: 4, shaky: 3, unmarked: 2, knew: 1 };
  var KINDS = ["concept", "numbers", "debug", "design"];

  function read(name, fallback) {
    try {
      var raw = window.localStorage.getItem(KEY + name);
      return raw === null ? fallback : JSON.parse(raw);
    } catch (error) {
      return fallback;
    }
  }

  function write(name, value) {
    try {
      if (value === null) window.localStorage.removeItem(KEY + name);
      else window.localStorage.setItem(KEY + name, JSON.stringify(value));
    } catch (error) {
      /* no storage: filters and drills work for this page view only */
    }
  }

  function h(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      if (name === "text") node.textContent = attrs[name];
      else node.setAttribute(name, attrs[name]);
    });
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  function questionUrl(root, id) {
    return new URL(root + id + "/", window.location.href).href;
  }

  function pathOf(url) {
    return new URL(url, window.location.href).pathname.replace(/index\.html$/, "");
  }

  /* Pick one id, each weighted by its mark; `random` is injectable for tests. */
  function pick(ids, exclude, random) {
    var marks = read("marks", {}) || {};
    var pool = ids.filter(function (id) { return id !== exclude; });
    if (!pool.length) pool = ids.slice();
    var total = 0;
    var weights = pool.map(function (id) {
      var w = WEIGHT[marks[id] || "unmarked"] || 1;
      total += w;
      return w;
    });
    var roll = (random || Math.random)() * total;
    for (var i = 0; i < pool.length; i += 1) {
      roll -= weights[i];
      if (roll < 0) return pool[i];
    }
    return pool[pool.length - 1];
  }

  function startDrill(root, ids) {
    if (!ids.length) return;
    write("drill", { root: new URL(root, window.location.href).href, ids: ids });
    write("mode", "practice");
    window.location.href = questionUrl(root, pick(ids, null));
  }

  // -------------------------------------------------------------------------
  // Bank index: filters and the drill button
  // -------------------------------------------------------------------------

  function indexPage(slot) {
    var questions = JSON.parse(slot.dataset.questions || "[]");
    var root = slot.dataset.root;
    var byPath = {};
    questions.forEach(function (q) { byPath[pathOf(questionUrl(root, q.id))] = q; });
    var parts = [];
    questions.forEach(function (q) { if (parts.indexOf(q.part) < 0) parts.push(q.part); });

    var state = read("filter", null) || {};
    var kinds = Array.isArray(state.kinds) && state.kinds.length ? state.kinds : KINDS.slice();
    var part = typeof state.part === "string" ? state.part : "";

    var bar = h("fieldset", { class: "bank-study__filters" }, [h("legend", { text: "Filter the bank" })]);
    var kindBoxes = KINDS.map(function (kind) {
      var box = h("input", { type: "checkbox", value: kind, class: "bank-study__kind" });
      box.checked = kinds.indexOf(kind) >= 0;
      bar.appendChild(h("label", { class: "bank-study__check" }, [box, " " + kind]));
      return box;
    });
    var select = h("select", { class: "bank-study__module", "aria-label": "Module" },
      [h("option", { value: "", text: "Every module" })]);
    parts.forEach(function (p) {
      var label = p;
      document.querySelectorAll("article h2 a[href]:not(.headerlink)").forEach(function (link) {
        if (pathOf(link.href).indexOf("/questions/" + p + "/") >= 0) label = link.textContent.trim();
      });
      select.appendChild(h("option", { value: p, text: label }));
    });
    select.value = part;
    bar.appendChild(h("label", { class: "bank-study__select" }, ["Module ", select]));
    var count = h("span", { class: "bank-study__count", role: "status", "aria-live": "polite" });
    bar.appendChild(count);

    var drill = h("button", { type: "button", class: "md-button md-button--primary bank-study__drill",
      text: "Random question" });
    drill.title = "A random question from the filtered list; shaky and missed ones come up more often";
    var actions = h("div", { class: "bank-study__actions" }, [drill]);

    function visible() {
      var chosen = kindBoxes.filter(function (b) { return b.checked; }).map(function (b) { return b.value; });
      var module = select.value;
      return questions.filter(function (q) {
        return chosen.indexOf(q.kind) >= 0 && (!module || q.part === module);
      });
    }

    function apply() {
      var shown = visible();
      var ids = shown.map(function (q) { return q.id; });
      write("filter", { kinds: kindBoxes.filter(function (b) { return b.checked; })
        .map(function (b) { return b.value; }), part: select.value });
      document.querySelectorAll("article table tbody tr").forEach(function (row) {
        var link = row.querySelector("a[href]");
        var q = link ? byPath[pathOf(link.href)] : null;
        if (q) row.classList.toggle("bank-study--hidden", ids.indexOf(q.id) < 0);
      });
      count.textContent = shown.length + " of " + questions.length + " questions shown";
      drill.disabled = !shown.length;
    }

    kindBoxes.forEach(function (box) { box.addEventListener("change", apply); });
    select.addEventListener("change", apply);
    drill.addEventListener("click", function () {
      startDrill(root, visible().map(function (q) { return q.id; }));
    });
    slot.appendChild(bar);
    slot.appendChild(actions);
    apply();
  }

  // -------------------------------------------------------------------------
  // Question page: the drill bar
  // -------------------------------------------------------------------------

  function drillBar(bar) {
    var drill = read("drill", null);
    var id = bar.dataset.question;
    if (!drill || !Array.isArray(drill.ids) || drill.ids.indexOf(id) < 0) return;
    var next = h("a", { class: "md-button md-button--primary bank-study__next",
      href: questionUrl(drill.root, pick(drill.ids, id)), text: "Next random question" });
    var stop = h("button", { type: "button", class: "bank-study__stop", text: "Stop the drill" });
    stop.addEventListener("click", function () {
      write("drill", null);
      box.remove();
    });
    var box = h("div", { class: "bank-study__drillbar" }, [
      h("span", { text: "Drill: " + drill.ids.length + " questions, shaky and missed ones first. " }),
      next, stop,
      h("span", { class: "bank-study__keys",
        text: "Keys: r reveals the next answer, 1 knew it, 2 shaky, 3 missed, n next question." })
    ]);
    bar.appendChild(box);
  }

  // -------------------------------------------------------------------------
  // Keyboard: r reveal, 1/2/3 mark, n next drill question
  // -------------------------------------------------------------------------

  function typing(target) {
    var tag = (target && target.tagName) || "";
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || (target && target.isContentEditable);
  }

  function onKey(event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    if (!document.querySelector(".bank-practice--bar")) return;
    var marks = { "1": "knew", "2": "shaky", "3": "missed" };
    if (event.key === "r") {
      var hidden = document.querySelector(".bank-answer--hidden");
      var button = hidden && hidden.previousElementSibling;
      if (button && button.classList.contains("bank-reveal")) {
        button.click();
        hidden.scrollIntoView({ block: "nearest" });
        event.preventDefault();
      }
    } else if (marks[event.key]) {
      var mark = document.querySelector('.bank-mark[data-mark="' + marks[event.key] + '"]');
      if (mark && mark.getAttribute("aria-pressed") !== "true") mark.click();
      event.preventDefault();
    } else if (event.key === "n") {
      var next = document.querySelector(".bank-study__next");
      if (next) {
        next.click();
        event.preventDefault();
      }
    }
  }

  // Capture phase, so Material's own shortcuts (it binds n and p to pages) never see a key we take.
  window.addEventListener("keydown", function (event) {
    var before = event.defaultPrevented;
    onKey(event);
    if (!before && event.defaultPrevented) event.stopImmediatePropagation();
  }, true);

  document$.subscribe(function () {
    document.querySelectorAll(".bank-study").forEach(indexPage);
    document.querySelectorAll(".bank-practice--bar").forEach(drillBar);
  });

  window.llmBankStudy = { pick: pick };
})();
