/*
 * Practice mode for the question bank.
 *
 * Study mode shows every answer. Practice mode hides each answer block until
 * the reader reveals it, so a question can be answered aloud first. Each
 * question can be marked "knew it", "shaky" or "missed"; the bank index shows
 * the marks per module and starts practice rounds from them.
 *
 * State lives in localStorage, so it survives reloads and Material's instant
 * navigation (which swaps the page without reloading scripts: every page,
 * first or swapped in, arrives through `document$`):
 *   llm-bank.mode    "study" or "practice"
 *   llm-bank.marks   {"part-0/<slug>": "knew" | "shaky" | "missed"}
 *   llm-bank.round   {label, root, ids}: the round in progress
 *
 * The build (docs/.hooks/bank_render.py) marks up what this script works on:
 *   div.bank-answer[data-reveal]           an answer block; hidden only by a class added here
 *   div.bank-practice--bar[data-question]  top of a question page: mode switch, round position
 *   div.bank-practice--marks               end of a question page: the three marks
 *   div.bank-practice--rounds[data-ids]    bank index: mode switch, totals, the shaky round
 *   div.bank-practice--module[data-ids]    a module: its totals, its round, a mark column
 * Those slots are empty <div>s, so without JavaScript the pages show every
 * answer and no controls that could not work.
 */
(function () {
  "use strict";

  var KEY = "llm-bank.";
  var MARKS = [
    { value: "knew", label: "Knew it" },
    { value: "shaky", label: "Shaky" },
    { value: "missed", label: "Missed" }
  ];
  var MARK_LABEL = { knew: "knew it", shaky: "shaky", missed: "missed" };

  // -------------------------------------------------------------------------
  // State
  // -------------------------------------------------------------------------

  function read(name, fallback) {
    try {
      var raw = window.localStorage.getItem(KEY + name);
      return raw === null ? fallback : JSON.parse(raw);
    } catch (error) {
      return fallback; // storage blocked or a value from an older format
    }
  }

  function write(name, value) {
    try {
      if (value === null) window.localStorage.removeItem(KEY + name);
      else window.localStorage.setItem(KEY + name, JSON.stringify(value));
    } catch (error) {
      /* private mode without storage: the page still works, nothing is remembered */
    }
  }

  function practising() {
    return read("mode", "study") === "practice";
  }

  function marks() {
    var value = read("marks", {});
    return value && typeof value === "object" ? value : {};
  }

  function setMark(id, mark) {
    var all = marks();
    if (mark) all[id] = mark;
    else delete all[id];
    write("marks", all);
  }

  // -------------------------------------------------------------------------
  // DOM helpers
  // -------------------------------------------------------------------------

  function h(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      if (name === "text") node.textContent = attrs[name];
      else if (name === "onclick") node.addEventListener("click", attrs[name]);
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

  function samePage(a, b) {
    var x = new URL(a, window.location.href);
    var y = new URL(b, window.location.href);
    return x.origin === y.origin && x.pathname.replace(/index\.html$/, "") === y.pathname.replace(/index\.html$/, "");
  }

  var liveRegion = null;

  function announce(text) {
    if (liveRegion) liveRegion.textContent = text;
  }

  // -------------------------------------------------------------------------
  // Answers: hide, reveal
  // -------------------------------------------------------------------------

  var answerCount = 0;

  function setAnswerShown(answer, shown) {
    var button = answer.previousElementSibling;
    answer.classList.toggle("bank-answer--hidden", !shown);
    if (button && button.classList.contains("bank-reveal")) {
      button.setAttribute("aria-expanded", String(shown));
      button.querySelector(".bank-reveal__text").textContent =
        (shown ? "Hide " : "Show ") + answer.dataset.reveal;
    }
  }

  function prepareAnswers() {
    document.querySelectorAll(".bank-answer").forEach(function (answer) {
      if (!answer.id) answer.id = "bank-answer-" + ++answerCount;
      var button = h("button", {
        type: "button",
        class: "bank-reveal",
        "aria-controls": answer.id,
        "aria-expanded": "true"
      }, [h("span", { class: "bank-reveal__text" })]);
      button.addEventListener("click", function () {
        var shown = answer.classList.contains("bank-answer--hidden");
        setAnswerShown(answer, shown);
        if (shown) answer.focus({ preventScroll: true });
      });
      answer.setAttribute("tabindex", "-1");
      answer.parentNode.insertBefore(button, answer);
    });
  }

  function applyMode() {
    var on = practising();
    document.documentElement.classList.toggle("bank-practising", on);
    document.querySelectorAll(".bank-answer").forEach(function (answer) {
      setAnswerShown(answer, !on);
    });
    document.querySelectorAll(".bank-switch").forEach(function (button) {
      button.setAttribute("aria-pressed", String(on));
      button.querySelector(".bank-switch__state").textContent = on ? "on" : "off";
    });
  }

  function modeSwitch() {
    var button = h("button", { type: "button", class: "bank-switch", "aria-pressed": "false" }, [
      h("span", { class: "bank-switch__track", "aria-hidden": "true" }, [h("span", { class: "bank-switch__thumb" })]),
      h("span", { class: "bank-switch__label", text: "Practice mode " }),
      h("span", { class: "bank-switch__state", text: "off" })
    ]);
    button.title = "Practice mode hides every answer until you reveal it (remembered on this device)";
    button.addEventListener("click", function () {
      var on = !practising();
      write("mode", on ? "practice" : "study");
      applyMode();
      var hidden = document.querySelectorAll(".bank-answer--hidden").length;
      announce(on ? "Practice mode on" + (hidden ? ": " + hidden + " answers hidden" : "")
                  : "Study mode: every answer shown");
    });
    return button;
  }

  // -------------------------------------------------------------------------
  // Rounds
  // -------------------------------------------------------------------------

  function roundLink(label, root, ids, text) {
    var link = h("a", { class: "md-button bank-round-start", href: questionUrl(root, ids[0]) }, [text]);
    link.addEventListener("click", function () {
      write("round", { label: label, root: new URL(root, window.location.href).href, ids: ids });
      write("mode", "practice");
    });
    return link;
  }

  function roundPosition(id) {
    var round = read("round", null);
    if (!round || !Array.isArray(round.ids)) return null;
    var index = round.ids.indexOf(id);
    if (index < 0) return null;
    return { round: round, index: index, last: index === round.ids.length - 1 };
  }

  function roundNav(id, where) {
    var position = roundPosition(id);
    if (!position) return null;
    var round = position.round;
    var box = h("div", { class: "bank-round bank-round--" + where }, [
      h("span", { class: "bank-round__where", text: round.label + ": question " + (position.index + 1) +
        " of " + round.ids.length })
    ]);
    if (!position.last) {
      box.appendChild(h("a", { class: "md-button md-button--primary bank-round__next",
        href: questionUrl(round.root, round.ids[position.index + 1]) }, ["Next question"]));
    } else {
      box.appendChild(h("a", { class: "md-button md-button--primary bank-round__next",
        href: new URL(round.root, window.location.href).href,
        onclick: function () { write("round", null); } }, ["Round done: back to the bank"]));
    }
    box.appendChild(h("button", { type: "button", class: "bank-round__leave", text: "Leave the round",
      onclick: function () {
        write("round", null);
        document.querySelectorAll(".bank-round").forEach(function (node) { node.remove(); });
        announce("Round left");
      } }));
    return box;
  }

  // -------------------------------------------------------------------------
  // Marks
  // -------------------------------------------------------------------------

  function markButtons(id, onChange) {
    var group = h("div", { class: "bank-marks", role: "group", "aria-label": "Mark this question" });
    MARKS.forEach(function (mark) {
      var button = h("button", { type: "button", class: "bank-mark bank-mark--" + mark.value,
        "data-mark": mark.value, "aria-pressed": String(marks()[id] === mark.value) }, [mark.label]);
      button.addEventListener("click", function () {
        var current = marks()[id];
        var next = current === mark.value ? null : mark.value; // pressing the set mark clears it
        setMark(id, next);
        syncMarks(id);
        announce(next ? "Marked " + MARK_LABEL[next] : "Mark cleared");
        if (onChange) onChange(next);
      });
      group.appendChild(button);
    });
    return group;
  }

  function syncMarks(id) {
    var current = marks()[id];
    document.querySelectorAll(".bank-mark").forEach(function (button) {
      button.setAttribute("aria-pressed", String(button.dataset.mark === current));
    });
    document.querySelectorAll(".bank-current-mark").forEach(function (node) {
      node.textContent = current ? "Your mark: " + MARK_LABEL[current] : "Not marked yet";
      node.dataset.mark = current || "";
    });
  }

  function counts(ids) {
    var all = marks();
    var out = { knew: 0, shaky: 0, missed: 0, unmarked: 0 };
    ids.forEach(function (id) { out[all[id] || "unmarked"] += 1; });
    return out;
  }

  function tally(ids) {
    var c = counts(ids);
    return h("span", { class: "bank-tally" }, [
      h("span", { class: "bank-tally__item", "data-mark": "knew", text: c.knew + " knew it" }),
      h("span", { class: "bank-tally__item", "data-mark": "shaky", text: c.shaky + " shaky" }),
      h("span", { class: "bank-tally__item", "data-mark": "missed", text: c.missed + " missed" }),
      h("span", { class: "bank-tally__item", "data-mark": "", text: c.unmarked + " unmarked" })
    ]);
  }

  // -------------------------------------------------------------------------
  // Page types
  // -------------------------------------------------------------------------

  function questionPage(bar) {
    var id = bar.dataset.question;
    bar.appendChild(modeSwitch());
    bar.appendChild(h("span", { class: "bank-practice__hint", text: "Answer aloud, then open each part." }));
    bar.appendChild(h("button", { type: "button", class: "bank-practice__link bank-practice__show-all",
      text: "Show every answer", onclick: function () {
        document.querySelectorAll(".bank-answer").forEach(function (answer) { setAnswerShown(answer, true); });
        announce("Every answer shown");
      } }));
    bar.appendChild(h("span", { class: "bank-current-mark" }));
    var nav = roundNav(id, "top");
    if (nav) bar.appendChild(nav);

    var end = document.querySelector(".bank-practice--marks");
    if (end) {
      end.appendChild(h("p", { class: "bank-marks__prompt", text: "How did you do?" }));
      end.appendChild(markButtons(id));
      var bottom = roundNav(id, "bottom");
      if (bottom) end.appendChild(bottom);
    }
    syncMarks(id);
  }

  function markColumn(slot, root) {
    // The first table after the slot lists the module's questions.
    var node = slot.nextElementSibling;
    var table = null;
    while (node && !table) {
      table = node.tagName === "TABLE" ? node : node.querySelector("table");
      node = node.nextElementSibling;
    }
    if (!table) return;
    var ids = slot.dataset.ids.split(" ");
    var all = marks();
    var head = table.querySelector("thead tr");
    if (head) head.appendChild(h("th", { text: "Your mark" }));
    table.querySelectorAll("tbody tr").forEach(function (row) {
      var link = row.querySelector("a[href]");
      var id = null;
      ids.forEach(function (candidate) {
        if (link && samePage(link.href, questionUrl(root, candidate))) id = candidate;
      });
      var mark = id ? all[id] : null;
      row.appendChild(h("td", {}, [h("span", { class: "bank-mark-badge", "data-mark": mark || "",
        text: mark ? MARK_LABEL[mark] : "–" })]));
    });
  }

  function moduleSlot(slot) {
    var ids = slot.dataset.ids.split(" ").filter(Boolean);
    var root = slot.dataset.root;
    slot.appendChild(tally(ids));
    slot.appendChild(roundLink(slot.dataset.label, root, ids, "Practise this module (" + ids.length + ")"));
    markColumn(slot, root);
  }

  function indexPage(slot) {
    var ids = slot.dataset.ids.split(" ").filter(Boolean);
    var root = slot.dataset.root;
    var all = marks();
    var weak = ids.filter(function (id) { return all[id] === "shaky" || all[id] === "missed"; });
    slot.appendChild(modeSwitch());
    slot.appendChild(h("span", { class: "bank-practice__total" }, ["Your marks: ", tally(ids)]));
    var actions = h("div", { class: "bank-practice__actions" });
    if (weak.length) {
      actions.appendChild(roundLink("Shaky and missed", root, weak,
        "Practise the shaky and missed ones (" + weak.length + ")"));
    } else {
      actions.appendChild(h("span", { class: "bank-practice__hint",
        text: "Mark questions as you practise; the shaky and missed ones gather here for another round." }));
    }
    if (Object.keys(all).length) {
      actions.appendChild(h("button", { type: "button", class: "bank-practice__clear", text: "Clear all marks",
        onclick: function () {
          if (window.confirm("Clear every mark on this device?")) {
            write("marks", {});
            window.location.reload();
          }
        } }));
    }
    slot.appendChild(actions);
  }

  // -------------------------------------------------------------------------
  // Every page
  // -------------------------------------------------------------------------

  document$.subscribe(function () {
    var slots = document.querySelectorAll(".bank-practice");
    if (!slots.length) return;
    liveRegion = h("div", { class: "bank-live bank-visually-hidden", role: "status", "aria-live": "polite" });
    slots[0].appendChild(liveRegion);
    prepareAnswers();
    slots.forEach(function (slot) {
      if (slot.classList.contains("bank-practice--bar")) questionPage(slot);
      else if (slot.classList.contains("bank-practice--rounds")) indexPage(slot);
      else if (slot.classList.contains("bank-practice--module")) moduleSlot(slot);
    });
    applyMode();
  });
})();
