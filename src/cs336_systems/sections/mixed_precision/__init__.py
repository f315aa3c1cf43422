"""Section 1.3-1.4 mixed_precision_accumulation, benchmarking_mixed_precision.

Accumulation in each precision, autocast dtypes of the toy model, LayerNorm's errors; (c)
reads the benchmark's records.

    run_study.py  CLI: one study (rules mixed_precision_accumulation, _toy_model, _layernorm)
    study.py      what it measures
    report.py     records -> tables, figures, facts
    template.md.j2facts -> prose
"""
