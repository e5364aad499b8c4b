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

  // Diagrams keep a minimum width at which their text (16 px in the diagram's
  // own units) is at least 11.5 px on screen; below it the frame scrolls
  // (docs/javascripts/scroll-cue.js says so) instead of shrinking the text.
  var BASE_FONT_PX = 16;
  var MIN_TEXT_PX = 11.5;

  function withMinimumWidth(svg) {
    var box = /viewBox="[-\d.]+ [-\d.]+ ([\d.]+) [\d.]+"/.exec(svg);
    if (!box) return svg;
    var minWidth = Math.ceil(parseFloat(box[1]) * MIN_TEXT_PX / BASE_FONT_PX);
    return svg.replace(/<svg([^>]*?)style="([^"]*)"/, function (tag, attrs, style) {
      return "<svg" + attrs + 'style="' + style + "; min-width: " + minWidth + 'px"';
    });
  }

  // Material draws each diagram in a closed shadow root; an open one lets the
  // page's scripts (scroll-cue.js) and the browser tests measure what it drew.
  var attachShadow = Element.prototype.attachShadow;
  Element.prototype.attachShadow = function (init) {
    if (this.classList && this.classList.contains("mermaid")) init = Object.assign({}, init, { mode: "open" });
    return attachShadow.call(this, init);
  };

  window.mermaid = {
    initialize: function (options) {
      settings = options || {};
    },
    render: function (id, text) {
      return load().then(function (mermaid) {
        return mermaid.render(id, text);
      }).then(function (result) {
        return Object.assign({}, result, { svg: withMinimumWidth(result.svg) });
      });
    }
  };
})();
