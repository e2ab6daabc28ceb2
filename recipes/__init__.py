"""The recipes shipped with tfdist, importable as `tfdist.recipes`.

    from tfdist.recipes import numbers_to_words     # encode, greedy_decode, to_text, predict

pyproject.toml maps the package `tfdist.recipes` to this directory; this file
makes it a regular package, which an editable install (`pip install -e .`)
finds (a mapped directory without one is not found there). `python -m
tfdist.train NAME` loads a recipe by file (`tfdist.recipe`), not through here.
"""
