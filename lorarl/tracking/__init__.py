"""MLflow tracking: the client (`client`), the shared server (`server`) and offline sync (`sync`)."""
