"""JetServe's shared package: the only code services have in common (messages, subjects, codec,
config, logging, errors, NATS helpers, registry access, block hashing)."""
