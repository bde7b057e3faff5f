"""The adaptive blocks of the study language: the `search:` and `hypotheses:` grammar (:mod:`.blocks`), the
seeds a hypothesis adds as ordinary cells (:mod:`.seeds`) and the settings the blocks decide on (:mod:`.settings`).
The decisions themselves live in lorarl.adaptive."""
