"""Each kind of model's own views: images (:mod:`.vision`, :mod:`.dino`), speech (:mod:`.speech`), spellings to
phonemes (:mod:`.g2p`) and translation (:mod:`.seq2seq`)."""
