"""The vLLM worker: JetServe's worker contract in front of vLLM, in-process (``AsyncLLM``) or
remote (an unmodified ``vllm serve`` over HTTP), with vLLM's ZMQ KV events relayed under
JetServe's block hashes. Only ``loader`` imports vllm; the package imports without it."""
