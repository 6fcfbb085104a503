"""Foreign layouts in one place: how the course's classes meet Hugging Face ``transformers`` (issue 41, item 4).

``hf``: which transformers class a course class mirrors, the check that a module is that class, the copy of a
linear layer, and the one answer to "is this HF attention layer a sliding one?".
"""
