"""delayd's daemon: configuration, the five-stage timer pipeline, consumer groups, HTTP API."""
