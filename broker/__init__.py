"""delayd's daemon: configuration, the five-stage timer pipeline, consumer groups, HTTP API."""

__version__ = "0.1.0"
