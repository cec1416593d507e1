"""Per-step timing for the decode loops (decoding.Decoder, batching.BatchDecoder): host clocks on a CPU, CUDA
events on a GPU.

A GPU runs kernels asynchronously, so a host clock reads a span right only after torch.cuda.synchronize(). Syncing
at every boundary of a step (five of them) stalls the host each time and drains the queue the GPU would otherwise
keep full: plain decoding paid that per token, speculation per step of several tokens, so GPU speedups came out
inflated. A CUDA event is a timestamp the GPU writes when it reaches that point of the stream, without stalling the
host; one synchronisation per step, where the loop needs the accepted tokens on the host anyway, makes a step's
events readable.
"""

from __future__ import annotations

import time

import torch


class StepTimer:
    """mark() at each boundary, sync() once before reading, then seconds(a, b) between two marks.

    On a CPU a mark is time.perf_counter() and sync() does nothing: the timings are host time, as they always were."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def mark(self) -> float | torch.cuda.Event:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def sync(self) -> None:
        """Wait for the device to reach every mark made so far: one call per step."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, start, end) -> float:
        """Seconds from mark start to mark end; on CUDA both must precede the last sync()."""
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start
