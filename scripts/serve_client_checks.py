"""The check counter the serve client scripts share (test_serve_openai.py,
test_serve_anthropic.py, test_serve_ollama.py): each check raises on failure, and the count
is printed at the end."""


class Checks:
    def __init__(self):
        self.count = 0

    def __call__(self, cond, what):
        if not cond:
            raise AssertionError(what)
        self.count += 1
