"""Section 7 parallelism strategies (2026).

The FFN's equations in sympy, checked by simulated collectives, evaluated with measured C and W.

    check_parallelism.py  CLI: the checks of the algebra (rule parallelism_checks)
    checks.py             what it measures
    report.py             records -> tables, figures, facts
    template.md.j2        facts -> prose
"""
