"""The formatter: token batches from workers in, exactly the bytes an OpenAI client expects out."""
