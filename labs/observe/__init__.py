"""Observability and SLO tuning labs: scrape /metrics over a run, profile engine steps, tune one knob at a time.

    python -m labs.observe.scrape --base-url http://127.0.0.1:8000 --duration 20 --out out/scrape
    python -m labs.observe.profile --model llama-3.1-8b --batch 32 --context 1024 --out out/profile
    python -m labs.observe.tune --model llama-3.1-8b --rate-scale 1.5 --out out/tune

Each writes its rows to --out and, with --record, merges them into labs/results/ through
labs/recorded.py. Pages read them through labs/observe/report.py.
"""
