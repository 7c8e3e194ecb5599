"""What a reader sees: the pictures (:mod:`.plots`), the offline page (:mod:`.page`), ``multihead show``
(:mod:`.show`), the step-by-step explanation (:mod:`.explain`) and its local server (:mod:`.serve`)."""
