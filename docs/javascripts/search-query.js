/*
 * Search for flags, metric names and identifiers: `--max-num-seqs`,
 * `vllm:num_requests_waiting`, `max_num_batched_tokens`.
 *
 * The index splits words on `-`, `_` and `:` (the `separator` of the search
 * plugin in mkdocs.yml), because lunr's query lexer always splits a query on
 * `-` and the index must split the same way. Two things still go wrong in the
 * query, and this script fixes them before Material's search worker sees it:
 *   - lunr reads a leading `-` as "must not contain", so `--max-num-seqs` is a
 *     QueryParseError (two operators, no term) and finds nothing;
 *   - `max-num-seqs` becomes three optional terms, `max` OR `num` OR `seqs*`,
 *     so a page full of "maximum" and "number" ranks first.
 * A query word that is an identifier (two or more leading dashes, or parts
 * joined by `-`, `_` or `:`) becomes its parts, every one required, the last
 * one a prefix so results follow the typing: `+max +num +seqs*`. Other words
 * pass through untouched, lunr's own syntax included.
 *
 * Loaded before Material's bundle (docs/.overrides/main.html): it wraps the
 * Worker constructor so the search worker's query messages pass through here.
 */
(function () {
  "use strict";
  var Native = window.Worker;
  var QUERY = 2; // Material's SearchMessageType.QUERY
  var IDENTIFIER = /^-{2,}\w|\w[-_:]+\w/;

  function rewrite(query) {
    return query.split(/(\s+)/).map(function (word) {
      if (!IDENTIFIER.test(word)) return word;
      var parts = word.replace(/["*]/g, "").split(/[-_:]+/).filter(Boolean);
      return parts.map(function (part, i) {
        return "+" + part + (i === parts.length - 1 ? "*" : "");
      }).join(" ");
    }).join("");
  }

  if (Native) {
    var SearchAwareWorker = function (url, options) {
      var worker = new Native(url, options);
      if (String(url).indexOf("/workers/search") === -1) return worker;
      var post = worker.postMessage.bind(worker);
      worker.postMessage = function (message, transfer) {
        if (message && message.type === QUERY && typeof message.data === "string") {
          message = { type: QUERY, data: rewrite(message.data) };
        }
        return transfer === undefined ? post(message) : post(message, transfer);
      };
      return worker;
    };
    SearchAwareWorker.prototype = Native.prototype;
    window.Worker = SearchAwareWorker;
  }

  window.searchQuery = { rewrite: rewrite }; // for the browser tests
})();
