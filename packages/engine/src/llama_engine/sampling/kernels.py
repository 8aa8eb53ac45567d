"""numba kernels of the sampling chain, one per llama.cpp sampler (src/llama-sampler.cpp).

A candidate array is llama.cpp's ``llama_token_data_array`` split into three parallel buffers
``ids: int32[cap]``, ``logits: float32[cap]``, ``probs: float32[cap]``, of which the first ``n``
entries are live, plus the ``sorted`` flag (sorted by logit, descending). Kernels edit the
buffers in place and return the new ``n`` / ``sorted`` / selected index, like their C++
counterparts edit ``cur_p``.

The arithmetic follows the C++ line by line: float32 where llama.cpp uses ``float`` (sums are
sequential, never pairwise), float64 where it uses ``double``, libm's expf/logf/powf (numba
calls them for float32 arguments). Sorting is stable: llama.cpp's ``std::partial_sort`` leaves
equal logits in an unspecified order, here they keep their current order.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .rng import canonical_double, canonical_float, discrete_sample
from .sorting import argsort_asc, gather_front, sort_prefix, top_positions

__all__ = [
    "dist",
    "greedy",
    "logit_bias",
    "min_p",
    "mirostat",
    "mirostat_v2",
    "penalties",
    "penalties_accept",
    "ring_push",
    "ring_push_many",
    "softmax",
    "temp",
    "temp_ext",
    "top_k",
    "top_n_sigma",
    "top_p",
    "typical",
    "xtc",
]

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_NEG_INF = np.float32(-np.inf)
_NEG_FLT_MAX = np.float32(-3.4028234663852886e38)


@njit(cache=True, nogil=True)
def softmax(ids, logits, probs, n, is_sorted, do_sort):
    """``llama_sampler_softmax_impl``: probs from logits in float32; returns the sorted flag."""
    if do_sort and not is_sorted:
        sort_prefix(ids, logits, probs, n, n)
        is_sorted = True
    max_l = logits[0]
    if not is_sorted:
        for i in range(1, n):
            if logits[i] > max_l:
                max_l = logits[i]
    cum_sum = _F0
    for i in range(n):
        p = np.float32(math.exp(logits[i] - max_l))
        probs[i] = p
        cum_sum += p
    for i in range(n):
        probs[i] = probs[i] / cum_sum
    return is_sorted


@njit(cache=True, nogil=True)
def top_k(ids, logits, probs, n, is_sorted, k):
    """``llama_sampler_top_k_impl``; returns the new n (the array is sorted afterwards when k > 0)."""
    if k <= 0:
        return n
    k = min(k, n)
    if not is_sorted:
        sort_prefix(ids, logits, probs, n, k)
    return k


@njit(cache=True, nogil=True)
def top_p(ids, logits, probs, n, is_sorted, p, min_keep):
    """``llama_sampler_top_p_apply`` (p < 1); returns the new n, the array ends sorted."""
    softmax(ids, logits, probs, n, is_sorted, False)
    if is_sorted:
        cum_sum = _F0
        for i in range(n):
            cum_sum += probs[i]
            if cum_sum >= p and i + 1 >= min_keep:
                return i + 1
        return n
    # llama.cpp tries the best 256 of a large array first and sorts everything only if needed;
    # the running sum is the same float32 sequence either way
    k = min(256, n) if n > 1024 else n
    order = top_positions(logits, n, k)
    while True:
        cum_sum = _F0
        for i in range(k):
            cum_sum += probs[order[i]]
            if cum_sum >= p and i + 1 >= min_keep:
                gather_front(ids, logits, probs, n, order, i + 1)
                return i + 1
        if k == n:
            gather_front(ids, logits, probs, n, order, n)
            return n
        k = n
        order = top_positions(logits, n, n)


@njit(cache=True, nogil=True)
def min_p(ids, logits, probs, n, is_sorted, p, min_keep):
    """``llama_sampler_min_p_apply`` (p > 0); returns (n, sorted)."""
    if n == 0:
        return n, is_sorted
    if not is_sorted:
        max_logit = _NEG_FLT_MAX
        for i in range(n):
            if logits[i] > max_logit:
                max_logit = logits[i]
        min_logit = max_logit + np.float32(math.log(p))
        count = 0
        for i in range(n):
            if logits[i] >= min_logit:
                count += 1
        if count > 0 and count >= min_keep:
            j = 0
            for i in range(n):
                if logits[i] >= min_logit:
                    ids[j] = ids[i]
                    logits[j] = logits[i]
                    probs[j] = probs[i]
                    j += 1
            return count, is_sorted
        sort_prefix(ids, logits, probs, n, n)
        is_sorted = True
    min_logit = logits[0] + np.float32(math.log(p))
    i = 1
    while i < n:
        if logits[i] < min_logit and i >= min_keep:
            break
        i += 1
    return i, is_sorted


@njit(cache=True, nogil=True)
def typical(ids, logits, probs, n, is_sorted, p, min_keep):
    """``llama_sampler_typical_apply`` (p < 1); returns the new n, the array ends unsorted."""
    softmax(ids, logits, probs, n, is_sorted, True)
    entropy = _F0
    for i in range(n):
        entropy += -probs[i] * np.float32(math.log(probs[i]))
    shifted = np.empty(n, dtype=np.float32)
    for i in range(n):
        shifted[i] = abs(-np.float32(math.log(probs[i])) - entropy)
    indices = argsort_asc(shifted, n)
    cum_sum = _F0
    last_idx = n
    for i in range(n):
        cum_sum += probs[indices[i]]
        if cum_sum > p and (min_keep == 0 or i >= min_keep - 1):
            last_idx = i + 1
            break
    gather_front(ids, logits, probs, n, indices, last_idx)
    return last_idx


@njit(cache=True, nogil=True)
def temp(logits, n, t):
    """``llama_sampler_temp_impl``: divide by t, or keep only the first maximum when t <= 0."""
    if n == 0:
        return
    if t <= _F0:
        max_i = 0
        max_l = logits[0]
        for i in range(1, n):
            if logits[i] > max_l:
                logits[max_i] = _NEG_INF
                max_i = i
                max_l = logits[i]
            else:
                logits[i] = _NEG_INF
        return
    for i in range(n):
        logits[i] = logits[i] / t


@njit(cache=True, nogil=True)
def temp_ext(ids, logits, probs, n, is_sorted, t, delta, exponent):
    """``llama_sampler_temp_ext_apply`` (dynamic temperature); returns the sorted flag."""
    if delta <= _F0:
        temp(logits, n, t)
        return is_sorted
    min_temp = max(_F0, t - delta)
    max_temp = t + delta
    if n <= 1:
        return is_sorted
    max_entropy = -np.float32(math.log(_F1 / np.float32(n)))
    is_sorted = softmax(ids, logits, probs, n, is_sorted, True)
    entropy = _F0
    for i in range(n):
        prob = probs[i]
        if prob > _F0:
            entropy -= prob * np.float32(math.log(prob))
    normalized = entropy / max_entropy
    dyn_temp = min_temp + (max_temp - min_temp) * np.float32(math.pow(normalized, exponent))
    temp(logits, n, dyn_temp)
    max_l = np.float64(logits[0])
    cum = 0.0
    for i in range(n):
        pd = math.exp(np.float64(logits[i]) - max_l)
        probs[i] = np.float32(pd)
        cum += pd
    for i in range(n):
        probs[i] = np.float32(np.float64(probs[i]) / cum)
    return is_sorted


@njit(cache=True, nogil=True)
def xtc(state, ids, logits, probs, n, is_sorted, probability, threshold, min_keep):
    """``llama_sample_xtc_apply`` (enabled); returns (n, sorted). Drops the leading tokens above threshold."""
    if n < 2:
        return n, is_sorted
    chance = canonical_float(state)
    if chance > probability:
        return n, is_sorted
    is_sorted = softmax(ids, logits, probs, n, is_sorted, True)
    pos_last = 0
    for i in range(n):
        if probs[i] >= threshold:
            pos_last = i
        else:
            break
    if n - pos_last >= min_keep and pos_last > 0:
        m = n - pos_last
        for i in range(m):  # forward: each source lies past every slot written before it
            ids[i] = ids[pos_last + i]
            logits[i] = logits[pos_last + i]
            probs[i] = probs[pos_last + i]
        n = m
    return n, is_sorted


@njit(cache=True, nogil=True)
def top_n_sigma(logits, n, nsig):
    """``llama_sampler_top_n_sigma_apply`` (n > 0): mask logits below max - nsig * std to -inf."""
    if n <= 1:
        return
    mx = logits[0]
    logits_sum = _F0
    valid = 0
    for i in range(n):
        v = logits[i]
        if v != _NEG_INF:
            if v > mx:
                mx = v
            logits_sum += v
            valid += 1
    mean = logits_sum / np.float32(valid) if valid > 0 else _F0
    acc = _F0
    for i in range(n):
        v = logits[i]
        if v != _NEG_INF:
            d = np.float64(v - mean)
            acc = np.float32(np.float64(acc) + d * d)  # acc += pow(x, 2): pow is double
    std = np.float32(math.sqrt(acc / np.float32(valid))) if valid > 0 else _F0
    cut = mx - nsig * std
    for i in range(n):
        if logits[i] < cut:
            logits[i] = _NEG_INF


@njit(cache=True, nogil=True)
def ring_push(ring, meta, token):
    """``ring_buffer::push_back`` on ring: int32[cap], meta: int64[3] = (first, size, pos)."""
    cap = ring.shape[0]
    if meta[1] == cap:
        meta[0] = (meta[0] + 1) % cap
    else:
        meta[1] += 1
    ring[meta[2]] = token
    meta[2] = (meta[2] + 1) % cap


@njit(cache=True, nogil=True)
def ring_push_many(ring, meta, tokens):
    """ring_push for each of tokens, in order."""
    for j in range(tokens.shape[0]):
        ring_push(ring, meta, tokens[j])


@njit(cache=True, nogil=True)
def penalties_accept(ring, meta, counts, tokens):
    """``llama_sampler_penalties_accept`` for each of tokens: the last tokens and their counts.

    ring: int32[last_n]; meta: int64[3] = (first, size, pos); counts: int32[n_vocab].
    """
    cap = ring.shape[0]
    n_vocab = counts.shape[0]
    for j in range(tokens.shape[0]):
        token = tokens[j]
        if 0 <= token < n_vocab:
            counts[token] += 1
        if meta[1] >= cap:
            old = ring[meta[0]]
            if 0 <= old < n_vocab:
                counts[old] -= 1
        ring_push(ring, meta, token)


@njit(cache=True, nogil=True)
def _penalize(logits, i, c, repeat, freq, present):
    v = logits[i]
    if v <= _F0:
        v = v * repeat
    else:
        v = v / repeat
    logits[i] = v - (np.float32(c) * freq + _F1 * present)


@njit(cache=True, nogil=True)
def penalties(ids, logits, n, counts, ring, meta, mark, identity, repeat, freq, present):
    """``llama_sampler_penalties_apply`` (enabled): repetition, frequency and presence penalties.

    identity: the candidates are the whole vocabulary in id order, so only the tokens of the
    history ring are visited (mark: uint8[n_vocab] scratch, left all zero).
    """
    if identity:
        cap = ring.shape[0]
        for j in range(meta[1]):
            t = ring[(meta[0] + j) % cap]
            if 0 <= t < n and mark[t] == 0:
                mark[t] = 1
                if counts[t] > 0:
                    _penalize(logits, t, counts[t], repeat, freq, present)
        for j in range(meta[1]):
            t = ring[(meta[0] + j) % cap]
            if 0 <= t < n:
                mark[t] = 0
        return
    for i in range(n):
        c = counts[ids[i]]
        if c > 0:
            _penalize(logits, i, c, repeat, freq, present)


@njit(cache=True, nogil=True)
def logit_bias(ids, logits, n, tokens, biases):
    """``llama_sampler_logit_bias_apply``: add biases in list order (duplicates add twice)."""
    m = tokens.shape[0]
    search = np.zeros(m, dtype=np.bool_)
    any_search = False
    for j in range(m):
        t = tokens[j]
        if t >= 0 and n > t and ids[t] == t:
            logits[t] += biases[j]
        else:
            search[j] = True
            any_search = True
    if not any_search:
        return
    for i in range(n):
        for j in range(m):
            if search[j] and ids[i] == tokens[j]:
                logits[i] += biases[j]
                break


@njit(cache=True, nogil=True)
def greedy(logits, n):
    """``llama_sampler_greedy_apply``: index of the first maximum."""
    sel = 0
    for i in range(1, n):
        if logits[i] > logits[sel]:
            sel = i
    return sel


@njit(cache=True, nogil=True)
def dist(state, logits, probs, n, is_sorted):
    """``llama_sampler_dist_apply``: softmax with a double sum, one uniform double draw, scan.

    Returns the selected index (-1 for an empty array); probs end normalised.
    """
    if n == 0:
        return -1
    if n == 1:
        canonical_double(state)  # keep the engine aligned: llama.cpp draws once per output
        probs[0] = _F1
        return 0
    max_l = logits[0]
    if not is_sorted:
        for i in range(1, n):
            if logits[i] > max_l:
                max_l = logits[i]
    sum_cum = 0.0
    for i in range(n):
        p = np.float32(math.exp(logits[i] - max_l))
        probs[i] = p
        sum_cum += np.float64(p)
    rnd = canonical_double(state)
    sum_tgt = sum_cum * rnd
    sum_run = 0.0
    selected = -1
    for i in range(n):
        if selected < 0:
            sum_run += np.float64(probs[i])
            if sum_run >= sum_tgt:
                selected = i
        probs[i] = np.float32(np.float64(probs[i]) / sum_cum)
    if selected < 0:
        selected = n - 1
    return selected


@njit(cache=True, nogil=True)
def _float_to_int32(x):
    # C++ int(float) on x86: out-of-range and NaN give INT_MIN
    if x > np.float32(-2147483649.0) and x < np.float32(2147483648.0):
        return int(x)
    return -2147483648


@njit(cache=True, nogil=True)
def mirostat(state, ids, logits, probs, n, is_sorted, n_vocab, tau, eta, m, mu):
    """``llama_sampler_mirostat_apply`` (v1); mu: float32[1] updated in place. Returns (n, selected)."""
    softmax(ids, logits, probs, n, is_sorted, True)
    sum_ti_bi = _F0
    sum_ti_sq = _F0
    i = 0
    while i < m - 1 and i < n - 1:
        t_i = np.float32(math.log(np.float32(i + 2) / np.float32(i + 1)))
        b_i = np.float32(math.log(probs[i] / probs[i + 1]))
        sum_ti_bi += t_i * b_i
        sum_ti_sq += t_i * t_i
        i += 1
    s_hat = sum_ti_bi / sum_ti_sq
    epsilon_hat = s_hat - _F1
    num = epsilon_hat * np.float32(math.pow(np.float32(2.0), mu[0]))
    den = _F1 - np.float32(math.pow(np.float32(n_vocab), -epsilon_hat))
    k = np.float32(math.pow(num / den, _F1 / s_hat))
    kk = max(_float_to_int32(k), 1)
    n = min(kk, n)  # top_k_impl on a sorted array
    softmax(ids, logits, probs, n, True, True)
    idx = discrete_sample(state, probs, n)
    observed = -np.float32(math.log2(probs[idx]))
    e = observed - tau
    mu[0] = mu[0] - eta * e
    return n, idx


@njit(cache=True, nogil=True)
def mirostat_v2(state, ids, logits, probs, n, is_sorted, tau, eta, mu):
    """``llama_sampler_mirostat_v2_apply``; mu: float32[1] updated in place. Returns (n, selected)."""
    softmax(ids, logits, probs, n, is_sorted, True)
    cut = n
    for i in range(n):
        if -np.float32(math.log2(probs[i])) > mu[0]:
            cut = i
            break
    n = max(cut, 1)
    softmax(ids, logits, probs, n, True, True)
    idx = discrete_sample(state, probs, n)
    observed = -np.float32(math.log2(probs[idx]))
    e = observed - tau
    mu[0] = mu[0] - eta * e
    return n, idx
