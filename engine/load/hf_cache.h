/* Finding a model in the local Hugging Face hub cache (what `huggingface-cli download` and
 * transformers write), so `-m owner/name` works as it does in the HF ecosystem. Nothing is downloaded. */
#ifndef TLLM_HF_CACHE_H
#define TLLM_HF_CACHE_H

/* The hub cache directory: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
 * else $HOME/.cache/huggingface/hub. Heap string, or NULL when none can be formed (no HOME). */
char *tllm_hf_cache_dir(void);

/* 1 if `s` has the shape of a repo id ("owner/name", optionally "@revision"), else 0. */
int tllm_hf_is_repo_id(const char *s);

/* The snapshot directory of repo id `spec` ("owner/name" or "owner/name@revision") in the cache:
 * <cache>/models--owner--name/snapshots/<commit>, the commit read from refs/<revision> (default main),
 * or the revision itself when it names a snapshot; without refs/main, the only snapshot there is.
 * Returns TLLM_OK with a heap path in *out, or TLLM_ERR_IO with a message saying where it looked. */
int tllm_hf_cache_find(const char *spec, char **out);

#endif
