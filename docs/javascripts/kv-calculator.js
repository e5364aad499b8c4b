/*
 * The KV-cache calculator (docs/labs/kv-sizing.md): how many tokens of KV
 * cache one GPU holds under vLLM, computed in the reader's browser.
 *
 * It mirrors the Python lab function by function, so the page and
 * `python -m labs.kv_sizing` print the same numbers (the browser tests check
 * every model on several GPUs):
 *   labs/kv_sizing/formula.py        kv_bytes_per_token, bytes_per_block,
 *                                    kv_cache_groups, blocks_per_request
 *   labs/kv_sizing/memory_budget.py  budget, estimate_activation_peak,
 *                                    _estimate_max_model_len
 * Its data (model geometry, GPU memory, vLLM's defaults and the estimates'
 * constants) is inlined in the page at build time, in the data-kv-calculator
 * attribute, by docs/.hooks/plots.py from the same files the lab reads;
 * nothing is typed here twice.
 */
(function () {
  "use strict";

  var GIB = 1073741824;

  // An input the page or vLLM refuses. `vllm` is vLLM's own message, where vLLM prints one.
  function InputError(message, vllm) {
    this.message = message;
    this.vllm = vllm || null;
  }

  function plural(count, one, many) {
    return n(count) + " " + (count === 1 ? one : (many || one + "s"));
  }

  // vLLM's ValueError for a context past the model's trained length (vllm/config/model.py,
  // _get_and_verify_max_len), worded in the data (plots.py) with the numbers as vLLM prints them.
  function checkMaxModelLen(data, model, L) {
    var limit = model.max_position_embeddings;
    if (L <= limit) return;
    throw new InputError(
      "the context length " + n(L) + " is past " + model.display_name + "'s " + n(limit) +
        " positions (max_position_embeddings). vLLM refuses to start; " + data.long_max_model_len_env +
        "=1 overrides the check, and past the trained length a RoPE model's outputs turn to NaN",
      data.max_model_len_error.replace("{max_model_len}", String(L)).replace("{limit}", String(limit))
        .replace("{env}", data.long_max_model_len_env)
    );
  }

  function cdiv(a, b) {
    return Math.ceil(a / b);
  }

  // -------------------------------------------------------------------------
  // formula.py
  // -------------------------------------------------------------------------

  function servingDtype(model) {
    return model.dtype === "float32" ? "bfloat16" : model.dtype;
  }

  function defaultBlockSize(data, model) {
    return model.mla ? data.mla_block_size : data.default_block_size;
  }

  function kvItemsize(data, model, kvDtype) {
    var name = kvDtype === "auto" ? servingDtype(model) : kvDtype;
    if (!(name in data.kv_dtype_bytes)) throw new InputError("unsupported kv cache dtype " + kvDtype);
    return data.kv_dtype_bytes[name];
  }

  function checkTensorParallel(model, tp) {
    if (model.n_heads % tp) {
      throw new InputError(model.display_name + ": " + model.n_heads +
        " query heads are not divisible by tensor parallel size " + tp);
    }
    if (!model.mla && model.n_kv_heads % tp && tp % model.n_kv_heads) {
      throw new InputError(model.display_name + ": tensor parallel size " + tp +
        " neither divides nor is a multiple of " + model.n_kv_heads + " KV heads");
    }
  }

  function kvHeadsPerRank(model, tp) {
    return model.mla ? 1 : Math.max(1, Math.floor(model.n_kv_heads / tp));
  }

  function layerBytesPerToken(data, model, kvDtype, tp) {
    var b = kvItemsize(data, model, kvDtype);
    if (model.mla) return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * b;
    return 2 * kvHeadsPerRank(model, tp) * model.head_dim * b;
  }

  function layerKinds(model) {
    var kinds = [];
    for (var i = 0; i < model.n_layers; i++) {
      var pattern = model.sliding_window ? model.sliding_window.layer_pattern : ["full"];
      kinds.push(pattern[i % pattern.length]);
    }
    return kinds;
  }

  // vLLM groups layers by kind into KV-cache groups of equal size (padding the last one).
  function kvCacheGroups(model) {
    var counts = new Map();
    layerKinds(model).forEach(function (kind) {
      counts.set(kind, (counts.get(kind) || 0) + 1);
    });
    if (counts.size === 1) {
      var only = Array.from(counts)[0];
      return [{ kind: only[0], layers: only[1], slots: only[1] }];
    }
    var values = Array.from(counts.values());
    var smallest = Math.min.apply(null, values);
    var largest = Math.max.apply(null, values);
    var groupSize = largest < smallest * 1.5 ? largest : smallest;
    var groups = [];
    counts.forEach(function (n, kind) {
      var nGroups = cdiv(n, groupSize);
      for (var i = 0; i < nGroups; i++) {
        groups.push({ kind: kind, layers: Math.max(0, cdiv(n - i, nGroups)), slots: groupSize });
      }
    });
    return groups;
  }

  function fullSlots(groups) {
    return groups.filter(function (g) { return g.kind === "full"; })
      .reduce(function (sum, g) { return sum + g.slots; }, 0);
  }

  function maxSlots(groups) {
    return Math.max.apply(null, groups.map(function (g) { return g.slots; }));
  }

  function kvBytesPerToken(data, model, kvDtype, tp) {
    var perLayer = layerBytesPerToken(data, model, kvDtype, tp);
    var groups = kvCacheGroups(model);
    if (!groups.some(function (g) { return g.kind === "full"; })) return perLayer * model.n_layers;
    return perLayer * fullSlots(groups);
  }

  function bytesPerBlock(data, model, blockSize, kvDtype, tp) {
    return blockSize * layerBytesPerToken(data, model, kvDtype, tp) * maxSlots(kvCacheGroups(model));
  }

  function blocksPerRequest(model, maxModelLen, blockSize, inFlight) {
    var total = 0;
    kvCacheGroups(model).forEach(function (g) {
      if (g.kind === "full") {
        total += cdiv(maxModelLen, blockSize);
      } else {
        var tokens = Math.min(model.sliding_window.window - 1 + inFlight, maxModelLen);
        total += cdiv(tokens, blockSize) + 1;
      }
    });
    return total;
  }

  // -------------------------------------------------------------------------
  // memory_budget.py
  // -------------------------------------------------------------------------

  function estimateActivationPeak(model, numTokens, maxNumSeqs, tp) {
    var b = servingDtype(model) !== "float32" ? 2 : 4;
    var inter = model.moe ? model.moe.experts_per_token * model.moe.moe_intermediate_size : model.intermediate_size;
    var perToken = (Math.floor(3 * inter / tp) + 2 * model.hidden_size) * b;
    return numTokens * perToken + maxNumSeqs * model.vocab_size * 4;
  }

  function estimateMaxModelLen(model, checkMemory, blockSize, bpb, inFlight, upper) {
    function fits(n) {
      return blocksPerRequest(model, n, blockSize, inFlight) * bpb <= checkMemory;
    }
    if (!fits(1)) return 0;
    var lo = 1, hi = upper, best = 1;
    while (lo <= hi) {
      var mid = Math.floor((lo + hi) / 2);
      if (fits(mid)) { best = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    return best;
  }

  function budget(data, input) {
    var model = data.models[input.model];
    var gpu = data.gpus[input.gpu];
    var L = input.max_model_len;
    var util = input.gpu_memory_utilization;
    var tp = input.tensor_parallel_size;
    if (!(Number.isInteger(L) && L >= 1)) throw new InputError("the context length must be a positive whole number of tokens");
    if (!(util > 0 && util <= 1)) throw new InputError("gpu_memory_utilization must be in (0, 1]");
    checkMaxModelLen(data, model, L);
    checkTensorParallel(model, tp);
    var blockSize = defaultBlockSize(data, model);
    var kvDtype = input.kv_cache_dtype === "auto" ? servingDtype(model) : input.kv_cache_dtype;
    var maxNumBatchedTokens = gpu.max_num_batched_tokens;
    var maxNumSeqs = input.max_num_seqs || gpu.max_num_seqs;
    var inFlight = 2 * maxNumBatchedTokens; // async scheduling: two batches in flight

    var activation = estimateActivationPeak(model, maxNumBatchedTokens, maxNumSeqs, tp);
    var nonTorch = data.non_torch + (tp > 1 ? data.non_torch_tp_extra : 0);
    var cudagraph = data.cudagraph;
    var total = gpu.total_memory;
    var requested = Math.ceil(total * util);
    var weights = Math.ceil(model.weight_bytes / tp);
    var kvPool = requested - weights - activation - nonTorch - cudagraph;

    var perLayer = layerBytesPerToken(data, model, kvDtype, tp);
    var groups = kvCacheGroups(model);
    var bpb = bytesPerBlock(data, model, blockSize, kvDtype, tp);
    var bpr = blocksPerRequest(model, L, blockSize, inFlight);
    var numBlocks = Math.floor(Math.max(kvPool, 0) / bpb);
    var perSeq = bpr * bpb;
    var checkMemory = kvPool - bpb; // the null block is never usable
    var estimatedLen = estimateMaxModelLen(model, checkMemory, blockSize, bpb, inFlight, L);
    var error = null;
    if (kvPool <= 0) {
      error = "No available memory for the cache blocks: the weights and the runtime overhead take the whole budget.";
    } else if (perSeq > checkMemory) {
      error = "One request at the full context needs " + gib(perSeq) + " of KV cache, more than the " +
        gib(checkMemory) + " available." +
        (estimatedLen > 0 ? " The longest context that fits is " + plural(estimatedLen, "token") + "." : "");
    }
    var concurrency = bpr ? numBlocks / bpr : 0;
    return {
      model: input.model, gpu: input.gpu, tensor_parallel_size: tp, max_model_len: L, block_size: blockSize,
      kv_cache_dtype: kvDtype, gpu_memory_utilization: util, max_num_batched_tokens: maxNumBatchedTokens,
      max_num_seqs: maxNumSeqs, total_memory: total, requested_memory: requested, weights: weights,
      activation_peak: activation, non_torch: nonTorch, cudagraph: cudagraph, kv_pool: kvPool,
      kv_bytes_per_token: kvBytesPerToken(data, model, kvDtype, tp), layer_bytes_per_token: perLayer,
      bytes_per_block: bpb, num_blocks: numBlocks, blocks_per_request: bpr, kv_bytes_per_sequence: perSeq,
      max_concurrency: concurrency, kv_cache_tokens: Math.floor(concurrency * L),
      kv_heads_per_rank: kvHeadsPerRank(model, tp), kv_cache_groups: groups,
      fits_one_request: error === null, estimated_max_model_len: estimatedLen, error: error
    };
  }

  // -------------------------------------------------------------------------
  // Page
  // -------------------------------------------------------------------------

  function n(value, digits) {
    return value.toLocaleString("en-US", { minimumFractionDigits: digits || 0, maximumFractionDigits: digits || 0 });
  }

  function gib(bytes) {
    return n(bytes / GIB, 2) + " GiB";
  }

  function size(bytes) {
    if (bytes >= GIB) return gib(bytes);
    if (bytes >= 1048576) return n(bytes / 1048576, 1) + " MiB";
    if (bytes >= 1024) return n(bytes / 1024, 1) + " KiB";
    return n(bytes) + " B";
  }

  function h(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function formulaRows(data, r) {
    var model = data.models[r.model];
    var b = data.kv_dtype_bytes[r.kv_cache_dtype];
    var tp = r.tensor_parallel_size;
    var slots = fullSlots(r.kv_cache_groups);
    var rows = [];
    var layerTerm, layerValues;
    if (model.mla) {
      layerTerm = "(kv_lora_rank + qk_rope_head_dim) × b";
      layerValues = "(" + model.mla.kv_lora_rank + " + " + model.mla.qk_rope_head_dim + ") × " + b;
    } else {
      layerTerm = "2 × H_kv per GPU × d × b";
      layerValues = "2 × " + r.kv_heads_per_rank + " × " + model.head_dim + " × " + b;
    }
    rows.push(["KV bytes per token, one layer", layerTerm, layerValues, n(r.layer_bytes_per_token) + " B"]);
    if (slots && slots !== model.n_layers) {
      var sliding = model.n_layers - r.kv_cache_groups.filter(function (g) { return g.kind === "full"; })
        .reduce(function (s, g) { return s + g.layers; }, 0);
      rows.push(["KV bytes per token", "one layer × full-attention layer slots",
        n(r.layer_bytes_per_token) + " × " + slots + " (" + sliding + " of " + model.n_layers +
        " layers slide over " + n(model.sliding_window.window) + " tokens)", size(r.kv_bytes_per_token)]);
    } else {
      rows.push(["KV bytes per token", "one layer × layers", n(r.layer_bytes_per_token) + " × " + model.n_layers,
        size(r.kv_bytes_per_token)]);
    }
    rows.push(["Requested", "⌈total × gpu_memory_utilization⌉",
      "⌈" + gib(r.total_memory) + " × " + r.gpu_memory_utilization + "⌉", gib(r.requested_memory)]);
    rows.push(["Weights per GPU", "weight bytes ÷ TP", gib(model.weight_bytes) + " ÷ " + tp, gib(r.weights)]);
    var inter = model.moe ? model.moe.experts_per_token + " × " + n(model.moe.moe_intermediate_size)
                          : n(model.intermediate_size);
    rows.push(["Activation peak (estimate)", "T × (3I/TP + 2H) × 2 + S × V × 4",
      n(r.max_num_batched_tokens) + " × (3 × " + inter + "/" + tp + " + 2 × " + n(model.hidden_size) + ") × 2 + " +
      n(r.max_num_seqs) + " × " + n(model.vocab_size) + " × 4", gib(r.activation_peak)]);
    rows.push(["Non-torch + CUDA graphs (estimates)", "workspaces" + (tp > 1 ? " + NCCL" : "") + " + graphs",
      gib(r.non_torch) + " + " + gib(r.cudagraph), gib(r.non_torch + r.cudagraph)]);
    rows.push(["KV pool", "requested − weights − activation − non-torch − graphs",
      [r.requested_memory, r.weights, r.activation_peak, r.non_torch, r.cudagraph].map(gib).join(" − "),
      gib(r.kv_pool)]);
    rows.push(["Bytes per block", "block size × one layer's bytes per token × group slots",
      r.block_size + " × " + n(r.layer_bytes_per_token) + " × " + maxSlots(r.kv_cache_groups), size(r.bytes_per_block)]);
    rows.push(["Blocks", "⌊KV pool ÷ bytes per block⌋", gib(r.kv_pool) + " ÷ " + size(r.bytes_per_block),
      n(r.num_blocks)]);
    var perGroup = r.kv_cache_groups.length > 1
      ? "summed over " + r.kv_cache_groups.length + " KV-cache groups"
      : "⌈" + n(r.max_model_len) + " ÷ " + r.block_size + "⌉";
    rows.push(["Blocks per request", "⌈L ÷ block size⌉ per group", perGroup, n(r.blocks_per_request)]);
    rows.push(["Maximum concurrency", "blocks ÷ blocks per request",
      n(r.num_blocks) + " ÷ " + n(r.blocks_per_request), n(r.max_concurrency, 2)]);
    rows.push(["KV cache size, tokens", "⌊concurrency × L⌋",
      n(r.max_concurrency, 2) + " × " + n(r.max_model_len), n(r.kv_cache_tokens)]);
    return rows;
  }

  function render(container, data, r) {
    var out = container.querySelector(".kv-calculator__results");
    out.textContent = "";
    var cards = h("div", "kv-calculator__cards");
    [["KV per token", size(r.kv_bytes_per_token), "kv_bytes_per_token"],
     ["KV pool", gib(Math.max(r.kv_pool, 0)), "kv_pool"],
     ["Requests at full context", r.fits_one_request ? n(r.max_concurrency, 1) : "none fit", "max_concurrency"],
     ["KV cache, tokens", n(r.kv_cache_tokens), "kv_cache_tokens"]].forEach(function (card) {
      var box = h("div", "kv-calculator__card");
      box.dataset.result = card[2];
      box.appendChild(h("span", "kv-calculator__card-label", card[0]));
      box.appendChild(h("strong", "kv-calculator__card-value", card[1]));
      cards.appendChild(box);
    });
    out.appendChild(cards);

    var verdict = h("p", "kv-calculator__verdict");
    if (r.error) {
      verdict.classList.add("kv-calculator__verdict--error");
      verdict.textContent = "vLLM would refuse to start. " + r.error;
    } else {
      var fit = Math.floor(r.max_concurrency);
      var batch = r.max_num_seqs;
      var whose = r.defaulted_batch ? "vLLM's default batch cap of " + plural(batch, "request")
                                    : "A batch of " + plural(batch, "request");
      var each = batch === 1 ? " tokens" : " tokens each";
      verdict.classList.add(fit >= batch ? "kv-calculator__verdict--ok" : "kv-calculator__verdict--short");
      verdict.textContent = fit >= batch
        ? whose + " at " + n(r.max_model_len) + each + " fits: the pool holds " + plural(fit, "such request") + "."
        : whose + " at " + n(r.max_model_len) + each + " would need " + plural(batch * r.blocks_per_request, "block") +
          "; the pool has " + n(r.num_blocks) + ", so " + n(fit) + (fit === 1 ? " runs" : " run") +
          " at once at full length. Shorter requests fit more; past that, the scheduler preempts.";
    }
    out.appendChild(verdict);

    var table = h("table", "kv-calculator__formula");
    var caption = h("caption", null, "The formula with your numbers (vLLM " + data.vllm_version + ", block size " +
      r.block_size + ", " + r.kv_cache_dtype + " KV, max_num_batched_tokens " + n(r.max_num_batched_tokens) + ")");
    table.appendChild(caption);
    var head = h("thead");
    var headRow = h("tr");
    ["Quantity", "Formula", "Your numbers", "Value"].forEach(function (label) { headRow.appendChild(h("th", null, label)); });
    head.appendChild(headRow);
    table.appendChild(head);
    var body = h("tbody");
    formulaRows(data, r).forEach(function (row) {
      var tr = h("tr");
      row.forEach(function (cell, i) { tr.appendChild(h(i === 0 ? "th" : "td", null, cell)); });
      body.appendChild(tr);
    });
    table.appendChild(body);
    var wrap = h("div", "kv-calculator__formula-wrap");
    wrap.appendChild(table);
    out.appendChild(wrap);
  }

  function readInput(form) {
    var get = function (name) { return form.elements[name].value.trim(); };
    return {
      model: get("model"),
      gpu: get("gpu"),
      max_model_len: Number(get("max_model_len")),
      kv_cache_dtype: get("kv_cache_dtype"),
      gpu_memory_utilization: parseFloat(get("gpu_memory_utilization")),
      max_num_seqs: get("max_num_seqs") === "" ? null : Number(get("max_num_seqs")),
      tensor_parallel_size: Number(get("tensor_parallel_size"))
    };
  }

  // -------------------------------------------------------------------------
  // State in the address: a link or Back brings the same inputs back
  // -------------------------------------------------------------------------

  var FIELDS = ["model", "gpu", "max_model_len", "kv_cache_dtype", "tensor_parallel_size",
                "gpu_memory_utilization", "max_num_seqs"];

  function restore(form) {
    var params = new URLSearchParams(location.search);
    FIELDS.forEach(function (name) {
      if (!params.has(name)) return;
      var field = form.elements[name];
      var value = params.get(name);
      if (field.tagName === "SELECT" && !Array.from(field.options).some(function (o) { return o.value === value; })) {
        return; // a stale or mistyped link: keep the default rather than an empty choice
      }
      field.value = value;
    });
  }

  function save(form) {
    var url = new URL(location.href);
    FIELDS.forEach(function (name) {
      var field = form.elements[name];
      if (field.value.trim() === field.dataset.initial) url.searchParams.delete(name);
      else url.searchParams.set(name, field.value.trim());
    });
    if (url.href !== location.href) history.replaceState(history.state, "", url.href);
  }

  function update(container, data) {
    var form = container.querySelector("form");
    var input = readInput(form);
    var model = data.models[input.model];
    form.elements.max_num_seqs.placeholder = "vLLM default: " + data.gpus[input.gpu].max_num_seqs;
    form.elements.max_model_len.max = model.max_position_embeddings;
    container.querySelector("[data-hint=max_model_len]").textContent =
      "up to " + n(model.max_position_embeddings) + " (the model's max_position_embeddings)";
    try {
      if (input.max_num_seqs !== null && !(Number.isInteger(input.max_num_seqs) && input.max_num_seqs >= 1)) {
        throw new InputError("the batch (max_num_seqs) must be a positive whole number");
      }
      var result = budget(data, input);
      result.defaulted_batch = input.max_num_seqs === null;
      container.kvResult = result;
      render(container, data, result);
    } catch (error) {
      if (!(error instanceof InputError)) throw error;
      container.kvResult = { error: error.message, invalid: true, vllm_error: error.vllm };
      var out = container.querySelector(".kv-calculator__results");
      out.textContent = "";
      out.appendChild(h("p", "kv-calculator__verdict kv-calculator__verdict--error", "Check the input: " + error.message + "."));
      if (error.vllm) {
        var quote = h("pre", "kv-calculator__vllm-error");
        quote.appendChild(h("code", null, "ValueError: " + error.vllm));
        out.appendChild(quote);
      }
    }
  }

  document$.subscribe(function () {
    document.querySelectorAll("[data-kv-calculator]").forEach(function (container) {
      var data = JSON.parse(container.dataset.kvCalculator);
      var form = container.querySelector("form");
      FIELDS.forEach(function (name) { form.elements[name].dataset.initial = form.elements[name].value.trim(); });
      restore(form);
      var changed = function () {
        update(container, data);
        save(form);
      };
      form.addEventListener("input", changed);
      form.addEventListener("change", changed);
      form.addEventListener("submit", function (event) { event.preventDefault(); });
      update(container, data);
    });
  });

  // For the browser tests and the curious: the same function the page uses.
  window.kvCalculator = { budget: budget };
})();
