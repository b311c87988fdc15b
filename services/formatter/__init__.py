"""The formatter: token batches from workers in, exactly the bytes a client expects out (OpenAI
SSE frames or JSON, or plain text deltas for the gRPC front end)."""
