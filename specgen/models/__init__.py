"""A model from its name to a verified file: models.txt's entries (manifest), pulling and deriving
them into the cache (resolve), the records that say a cached file is still the entry's (integrity),
the target's own derived draft (selfdraft) and the cost curves a derivation measures (curves).

Above llama/ (it quantizes and rewrites GGUF files through it), below drafting/ and app/."""
