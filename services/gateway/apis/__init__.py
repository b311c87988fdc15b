"""Pure API dialects: request bytes -> a validated Struct -> a bus message, and the shapes back
(OpenAI chat/completions, Responses, Anthropic Messages, embeddings, media, KServe v2)."""
