"""Step latency model: prefill cost grows with new prompt tokens, decode cost with batch KV.

The default coefficients are NVIDIA Dynamo's mocker polynomial model
(``lib/mocker/src/common/perf_model.rs``, ``PerfModel::Polynomial``), so simulated timings
compare with Dynamo's mocker:

- prefill_ms(t) = 4.209989e-07 * t**2 + 1.518344e-02 * t + 16.50142, ``t`` = new prompt tokens
  computed in the step across the batch (0 when there are none);
- decode_ms(p) = max(1, -25.74 * p**2 + 54.01 * p + 5.74), ``p`` = the KV tokens of the
  requests decoding in the step / KV capacity in tokens (capped at 1). A request whose prefill
  completes in the step is not one of them: its cost is the prefill term (Dynamo 1.6.1 measured
  this way, decision 005).

Pure: no clock, no I/O. Every time is divided by the speedup ratio; a ratio of 0 means no delay.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolynomialTiming:
    """Dynamo's polynomial perf model (milliseconds)."""

    prefill_a: float = 4.209989e-07
    prefill_b: float = 1.518344e-02
    prefill_c: float = 1.650142e01
    decode_a: float = -25.74
    decode_b: float = 54.01
    decode_c: float = 5.74
    min_decode_ms: float = 1.0
    """Token-emitting decode steps never collapse onto the same instant."""

    def prefill_ms(self, new_tokens: int) -> float:
        """Time to compute ``new_tokens`` prompt tokens in one step (0 for none)."""
        if new_tokens <= 0:
            return 0.0
        t = float(new_tokens)
        return max(0.0, self.prefill_a * t * t + self.prefill_b * t + self.prefill_c)

    def decode_ms(self, active_kv_tokens: int, total_kv_tokens: int) -> float:
        """Time of one decode step with ``active_kv_tokens`` of ``total_kv_tokens`` in use."""
        p = 1.0 if total_kv_tokens <= 0 else min(1.0, max(0, active_kv_tokens) / total_kv_tokens)
        return max(self.min_decode_ms, self.decode_a * p * p + self.decode_b * p + self.decode_c)

    def step_s(
        self,
        *,
        prefill_tokens: int,
        decode_seqs: int,
        active_kv_tokens: int,
        total_kv_tokens: int,
        speedup_ratio: float,
    ) -> float:
        """Wall time of one engine step in seconds, scaled by ``speedup_ratio`` (0 = none)."""
        if speedup_ratio <= 0:
            return 0.0
        ms = self.prefill_ms(prefill_tokens)
        if decode_seqs > 0:
            ms += self.decode_ms(active_kv_tokens, total_kv_tokens)
        return ms / 1000.0 / speedup_ratio
