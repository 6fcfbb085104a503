"""Foreign layouts in one place: how the course's classes meet Hugging Face
``transformers`` (issue 41, item 4).

``hf``: which transformers class a course class mirrors, the check that a
module is that class, the copy of a linear layer, and the one answer to "is
this HF attention layer a sliding one?" (imported by the course's classes).
``hf_models``: the reference side: HF layers of chapters 14 and 17 built
offline with random weights and run as their models run them, and the course's
GPT as a StarCoder2 (chapter 18). It imports the chapters' classes, so no
chapter's package imports it: a chapter's module never imports from a later
chapter's (``tests/test_imports.py``).
"""
