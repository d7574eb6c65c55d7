"""scikit-learn's handwritten digits as your own adaptfl task (task.py)."""
