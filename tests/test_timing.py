"""Step timings: host clocks on a CPU (positive, adding up), CUDA events with one synchronisation per step on a GPU
(faked here: torch.cuda.Event and synchronize replaced by counting stand-ins)."""

import time

import pytest
import torch

from specbench.acceptance import ExactAcceptance
from specbench.batching import BatchDecoder
from specbench.decoding import Decoder
from specbench.drafters.pld import PromptLookupDrafter
from specbench.sampling import SamplingParams
from specbench.timing import StepTimer
from specbench.trees.native import NativePolicy

TEXTS = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "hello world " * 6]


def decoder(tiny, cls=Decoder, max_new=24):
    return cls(tiny.model, PromptLookupDrafter(None, NativePolicy(11)), ExactAcceptance(), SamplingParams(), max_new,
               [], max_context=tiny.max_context)


@pytest.fixture
def prompts(tiny):
    return [tiny.tokenizer(t)["input_ids"] for t in TEXTS]


def check_step_times(steps):
    assert steps
    for s in steps:
        assert s.draft_time > 0 and s.verify_time > 0
        assert s.step_time >= s.draft_time + s.verify_time - 1e-12  # the rest is acceptance and bookkeeping


def test_cpu_timings_are_positive_and_add_up(tiny, prompts):
    for prompt in prompts:
        gen = decoder(tiny).generate(prompt)
        check_step_times(gen.steps)
        assert gen.prefill_time > 0
        assert gen.wall_time >= gen.prefill_time + sum(s.step_time for s in gen.steps)


def test_batched_cpu_timings_are_positive_and_add_up(tiny, prompts):
    batch = decoder(tiny, BatchDecoder)
    gens = batch.generate_batch(prompts)
    run = batch.last_run
    check_step_times(run.steps)
    assert run.wall_time >= run.prefill_time + sum(s.step_time for s in run.steps)
    for gen in gens:
        check_step_times(gen.steps)
        assert gen.prefill_time == run.prefill_time < gen.wall_time <= run.wall_time
        assert gen.wall_time >= gen.prefill_time + sum(s.step_time for s in gen.steps)


def test_the_cpu_path_never_touches_cuda(tiny, prompts, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("CUDA called on a CPU run")
    monkeypatch.setattr(torch.cuda, "synchronize", fail)
    monkeypatch.setattr(torch.cuda, "Event", fail)
    timer = StepTimer("cpu")
    a = timer.mark()
    assert isinstance(a, float)
    timer.sync()
    assert timer.seconds(a, timer.mark()) >= 0
    decoder(tiny).generate(prompts[0])


class FakeCuda:
    """torch.cuda's Event, current_stream and synchronize for a machine without a GPU: an event takes the host
    time when recorded and, like a real one, can be read only after a synchronisation that followed its record."""

    def __init__(self, monkeypatch):
        self.syncs, self.pending = 0, []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.at, self.done = None, False

            def record(self, stream=None):
                assert stream == "stream"
                self.at = time.perf_counter()
                fake.pending.append(self)

            def elapsed_time(self, end):
                assert self.done and end.done, "an event read before a synchronisation"
                return 1e3 * (end.at - self.at)

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device: "stream")
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)

    def synchronize(self, device=None):
        assert torch.device(device).type == "cuda"
        self.syncs += 1
        for event in self.pending:
            event.done = True
        self.pending = []


def test_cuda_timing_synchronises_once_per_step(tiny, prompts, monkeypatch):
    """Before, every boundary synchronised: five per step. Now one per step, plus one after the prefill and one at
    the end of the generation."""
    cuda = FakeCuda(monkeypatch)
    dec = decoder(tiny)
    dec.timer = StepTimer("cuda")
    gen = dec.generate(prompts[0])
    assert len(gen.steps) > 3 and cuda.syncs == len(gen.steps) + 2
    check_step_times(gen.steps)
    assert gen.wall_time >= gen.prefill_time + sum(s.step_time for s in gen.steps) > 0


def test_batched_cuda_timing_synchronises_once_per_step(tiny, prompts, monkeypatch):
    """Also when sequences finish at different steps: their wall times are marks read after the last step."""
    cuda = FakeCuda(monkeypatch)
    batch = decoder(tiny, BatchDecoder)
    batch.timer = StepTimer("cuda")
    gens = batch.generate_batch([prompts[0], [5] * (tiny.max_context - 4)])  # the second hits the context end
    run = batch.last_run
    assert cuda.syncs == len(run.steps) + 2
    check_step_times(run.steps)
    assert len({len(g.steps) for g in gens}) == 2  # the sequences did finish at different steps
    for gen in gens:
        check_step_times(gen.steps)
        assert run.prefill_time < gen.wall_time <= run.wall_time
