"""``python -m attention_course.distributed --world-size 4``: both schemes on P
processes, verdicts printed."""

from .demos import main

if __name__ == "__main__":
    main()
