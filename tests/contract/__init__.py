"""The worker contract every engine meets (issue 11), written once and run against each engine."""
