"""What evenflow shows about itself: metrics, telemetry, logs, CPU accounting."""
