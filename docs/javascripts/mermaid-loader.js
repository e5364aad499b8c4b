/*
 * A stand-in for the `mermaid` global, loaded before Material's bundle.
 *
 * Material renders ```mermaid fences with window.mermaid (initialize, then
 * render per diagram) and, when no such global exists, loads Mermaid from
 * unpkg.com. This stand-in keeps the reader's browser on this site: the first
 * render() loads the copy under assets/vendor/mermaid/ (pinned and checked by
 * docs/.hooks/assets.py), which replaces the stand-in as window.mermaid. Pages
 * without a diagram never load the 3.5 MB library.
 */
(function () {
  "use strict";
  var src = new URL("../assets/vendor/mermaid/mermaid.min.js", document.currentScript.src).href;
  var settings = {};
  var loading = null;

  function load() {
    if (!loading) {
      loading = new Promise(function (resolve, reject) {
        var script = document.createElement("script");
        script.src = src;
        script.onload = function () {
          window.mermaid.initialize(settings);
          resolve(window.mermaid);
        };
        script.onerror = function () {
          loading = null;
          reject(new Error("could not load " + src));
        };
        document.head.appendChild(script);
      });
    }
    return loading;
  }

  window.mermaid = {
    initialize: function (options) {
      settings = options || {};
    },
    render: function (id, text) {
      return load().then(function (mermaid) {
        return mermaid.render(id, text);
      });
    }
  };
})();
