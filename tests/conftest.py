import os

# Integration tests start daemons that import the project from the checkout.
os.environ.setdefault("PYTHONHASHSEED", "0")
