// llama.cpp's `draft-mtp` drafter for several sequences at once, as llama-server drives it for its
// slots: `common_speculative_init(params, n_seq)`, one draft call for every slot that drafts, every
// target batch handed to `common_speculative_process`, and an accept per slot.
//
// llama-cpp-sys-2's own wrapper (`llama_rs_mtp_speculative_*`) serves sequence 0 only. This file is
// compiled by tuner/build.rs against the same llama.cpp sources and flags as that wrapper, and links
// against the same libllama-common, so the drafter is llama.cpp's code, not a copy of it.

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common.h"
#include "llama.h"
#include "speculative.h"

namespace {

enum status : int32_t {
    OK = 0,
    INVALID = 1,
    EXCEPTION = 2,
};

struct slot {
    std::vector<llama_token> history;
    std::vector<llama_token> draft;
    // Marked for the next draft call.
    bool marked = false;
    // The last draft was not empty and waits for its accept.
    bool pending = false;
};

}  // namespace

struct autotune_mtp {
    common_params_speculative params;
    common_speculative * spec = nullptr;
    common_batch batch;
    std::vector<slot> slots;
};

extern "C" {

autotune_mtp * autotune_mtp_init(llama_context * ctx_tgt, llama_context * ctx_dft, int32_t n_max,
                                 uint32_t n_seq) {
    if (!ctx_tgt || !ctx_dft || n_max <= 0 || n_seq == 0) {
        return nullptr;
    }
    try {
        auto m = std::make_unique<autotune_mtp>();
        m->params.types = { COMMON_SPECULATIVE_TYPE_DRAFT_MTP };
        m->params.draft.ctx_tgt = ctx_tgt;
        m->params.draft.ctx_dft = ctx_dft;
        m->params.draft.n_max = n_max;
        m->params.draft.n_min = 0;
        m->params.draft.p_min = 0.0f;
        m->batch = common_batch(ctx_tgt);
        m->slots.resize(n_seq);
        m->spec = common_speculative_init(m->params, n_seq);
        if (!m->spec) {
            return nullptr;
        }
        return m.release();
    } catch (...) {
        return nullptr;
    }
}

void autotune_mtp_free(autotune_mtp * m) {
    if (!m) {
        return;
    }
    if (m->spec) {
        common_speculative_free(m->spec);
    }
    delete m;
}

static bool valid_seq(const autotune_mtp * m, int32_t seq) {
    return m && m->spec && seq >= 0 && (size_t) seq < m->slots.size();
}

// A new generation of sequence `seq` after `prompt`, which the target and process() have seen.
int32_t autotune_mtp_begin(autotune_mtp * m, int32_t seq, const llama_token * prompt, size_t n) {
    if (!valid_seq(m, seq) || (!prompt && n > 0)) {
        return INVALID;
    }
    try {
        auto & s = m->slots[seq];
        s.history.assign(prompt, prompt + n);
        s.pending = false;
        common_speculative_begin(m->spec, seq, s.history);
        return OK;
    } catch (...) {
        return EXCEPTION;
    }
}

// The MTP context catches up on the batch the target just decoded: `n` tokens, each of one
// sequence, every sequence's tokens consecutive (as llama-server's batches are).
int32_t autotune_mtp_process(autotune_mtp * m, int32_t n, const llama_token * tokens,
                             const llama_pos * pos, const llama_seq_id * seqs) {
    if (!m || !m->spec || n <= 0 || !tokens || !pos || !seqs) {
        return INVALID;
    }
    for (int32_t k = 0; k < n; ++k) {
        if (!valid_seq(m, seqs[k])) {
            return INVALID;
        }
    }
    try {
        m->batch.clear();
        for (int32_t k = 0; k < n; ++k) {
            m->batch.add(tokens[k], pos[k], seqs[k], true);
        }
        return common_speculative_process(m->spec, m->batch) ? OK : EXCEPTION;
    } catch (...) {
        return EXCEPTION;
    }
}

// Marks sequence `seq` as drafting in the next autotune_mtp_draft: up to `n_max` tokens after
// `last` at position `pos0`, `history` being the tokens its caches hold.
int32_t autotune_mtp_want(autotune_mtp * m, int32_t seq, int32_t n_max, llama_pos pos0,
                          llama_token last, const llama_token * history, size_t n) {
    if (!valid_seq(m, seq) || n_max <= 0 || pos0 < 0 || (!history && n > 0) ||
        m->slots[seq].pending) {
        return INVALID;
    }
    try {
        auto & s = m->slots[seq];
        s.history.assign(history, history + n);
        s.draft.clear();
        auto & dp = common_speculative_get_draft_params(m->spec, seq);
        dp = {};
        dp.drafting = true;
        dp.n_max = n_max;
        dp.pos0 = pos0;
        dp.id_last = last;
        dp.prompt = &s.history;
        dp.result = &s.draft;
        s.marked = true;
        return OK;
    } catch (...) {
        return EXCEPTION;
    }
}

// Drafts for every sequence marked since the last call, in shared batches.
int32_t autotune_mtp_draft(autotune_mtp * m) {
    if (!m || !m->spec) {
        return INVALID;
    }
    try {
        common_speculative_draft(m->spec);
        for (auto & s : m->slots) {
            if (s.marked) {
                s.pending = !s.draft.empty();
                s.marked = false;
            }
        }
        return OK;
    } catch (...) {
        return EXCEPTION;
    }
}

// The last draft of sequence `seq`: its length in `*len`, its tokens copied to `out` (`cap` long).
int32_t autotune_mtp_result(const autotune_mtp * m, int32_t seq, llama_token * out, size_t cap,
                            size_t * len) {
    if (!valid_seq(m, seq) || !len || m->slots[seq].marked) {
        return INVALID;
    }
    const auto & d = m->slots[seq].draft;
    *len = d.size();
    if (d.size() > cap || (!d.empty() && !out)) {
        return INVALID;
    }
    if (!d.empty()) {
        std::memcpy(out, d.data(), d.size() * sizeof(llama_token));
    }
    return OK;
}

// How many of sequence `seq`'s last (non-empty) draft the target accepted.
int32_t autotune_mtp_accept(autotune_mtp * m, int32_t seq, uint16_t n_accepted) {
    if (!valid_seq(m, seq) || !m->slots[seq].pending ||
        n_accepted > m->slots[seq].draft.size()) {
        return INVALID;
    }
    try {
        common_speculative_accept(m->spec, seq, n_accepted);
        m->slots[seq].pending = false;
        return OK;
    } catch (...) {
        return EXCEPTION;
    }
}

}  // extern "C"
