"""The multirun sweep summary: every job's summary in one table with its swept settings, and a plot against them."""

import pandas as pd

from specbench.reporting.sweep import sweep_summary


def test_sweep_summary_joins_the_jobs_with_their_swept_settings(tmp_path):
    for job, b in enumerate((1, 4)):
        folder = tmp_path / f"{job}_eval.batch_size={b}"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text(f"- eval.batch_size={b}\n- experiment=sssd_batch\n")
        pd.DataFrame({"method": ["autoregressive", "pld"], "tau": [1.0, 1.3], "tokens_per_s": [10.0, 12.0 / b],
                      "throughput_tokens_per_s": [10.0 * b, 12.0], "throughput_speedup": [1.0, 1.2 / b],
                      "model": "m", "hw": "cpu", "dtype": "float32", "dataset": "d", "num_prompts": 4,
                      "cpu_capability": "AVX2"}).to_csv(folder / "summary.csv", index=False)
    table = sweep_summary(tmp_path)
    saved = pd.read_csv(tmp_path / "sweep_summary.csv")
    assert len(table) == len(saved) == 4 and sorted(saved["eval.batch_size"].unique()) == [1, 4]
    assert "experiment" not in saved  # only what was swept
    pld = saved[saved["method"] == "pld"].set_index("eval.batch_size")
    assert pld.loc[4, "throughput_speedup"] == 0.3
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_a_sweep_without_summaries_writes_nothing(tmp_path):
    assert sweep_summary(tmp_path) is None and not (tmp_path / "sweep_summary.csv").exists()
