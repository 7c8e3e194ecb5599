"""KV studies: which key/value heads a head-aware cache keeps (:mod:`.heads`), needle recall against bytes for every
policy (:mod:`.curves`), and attention sinks under a streaming cache (:mod:`.streaming`)."""
