"""What tests share: the tiny model, the tiny study, the Snakemake runner, the fake vLLM, report fixtures and
the helpers two test modules need. No test module imports another; each imports from here
(tests/project/test_structure.py holds it)."""
