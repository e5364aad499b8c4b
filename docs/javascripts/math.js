/*
 * Typesets math with KaTeX (assets/vendor/katex/, fetched at build time by
 * docs/.hooks/assets.py). pymdownx.arithmatex in generic mode leaves each
 * formula in a span or div of class "arithmatex", delimited by \( \) or \[ \];
 * only those elements are touched, so a dollar sign in prose stays a dollar.
 * A formula KaTeX cannot parse stays as its source and is reported on the
 * console, where the browser tests look for errors.
 */
document$.subscribe(function () {
  "use strict";
  document.querySelectorAll(".arithmatex").forEach(function (element) {
    if (element.dataset.typeset) return;
    var source = element.textContent.trim();
    var display = source.indexOf("\\[") === 0;
    var tex = source.replace(/^\\[([]/, "").replace(/\\[)\]]$/, "");
    try {
      katex.render(tex, element, { displayMode: display, throwOnError: true });
      element.dataset.typeset = "katex";
    } catch (error) {
      console.error("KaTeX could not typeset " + JSON.stringify(tex) + ": " + error.message);
    }
  });
});
