/*
 * A visible sign that a frame scrolls sideways: wide tables, display
 * equations, diagrams, plots (at their minimum width) and the calculator's
 * formula table keep their size and scroll inside their frame rather than
 * shrink their text or widen the page. A frame whose content is wider than it
 * gets the class `is-scrollable` (its right edge fades until scrolled to the
 * end), a short line above it that says so, and a tabindex so the keyboard can
 * scroll it. Rechecked when content changes (math typeset, a diagram drawn, a
 * plot loaded) and when the window resizes.
 */
(function () {
  "use strict";
  var FRAMES = ".md-typeset__scrollwrap, div.arithmatex, div.mermaid, .plot-scroll, .kv-calculator__formula-wrap";

  function cue(frame, create) {
    var before = frame.previousElementSibling;
    if (before && before.classList.contains("scroll-cue")) return before;
    if (!create) return null;
    var line = document.createElement("p");
    line.className = "scroll-cue";
    line.setAttribute("aria-hidden", "true");
    line.textContent = "Wider than the screen: scroll sideways for the rest";
    frame.parentNode.insertBefore(line, frame);
    return line;
  }

  function check(frame) {
    var over = frame.scrollWidth > frame.clientWidth + 1;
    frame.classList.toggle("is-scrollable", over);
    frame.classList.toggle("is-scrolled-end", over && frame.scrollLeft + frame.clientWidth >= frame.scrollWidth - 1);
    var line = cue(frame, over);
    if (line) line.classList.toggle("scroll-cue--shown", over);
    if (over && !frame.hasAttribute("tabindex")) frame.setAttribute("tabindex", "0");
    if (!frame.dataset.scrollCue) {
      frame.dataset.scrollCue = "1";
      frame.addEventListener("scroll", function () { check(frame); }, { passive: true });
    }
  }

  var pending = null;
  function checkAll() {
    if (pending) return;
    pending = requestAnimationFrame(function () {
      pending = null;
      document.querySelectorAll(FRAMES).forEach(check);
    });
  }

  var observer = new MutationObserver(checkAll);
  document$.subscribe(function () {
    var content = document.querySelector(".md-content");
    observer.disconnect();
    if (content) observer.observe(content, { childList: true, subtree: true });
    checkAll();
  });
  window.addEventListener("resize", checkAll);
  document.addEventListener("load", checkAll, true); // a plot image arriving changes its frame's width
  window.scrollCue = { checkAll: checkAll };
})();
