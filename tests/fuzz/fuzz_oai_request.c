/* An OpenAI request body as tllm serve reads it (chat or completion, chosen by the first byte): every
 * input is parsed or refused with a message, and what is parsed keeps the limits the server relies on. */
#include <stdlib.h>
#include <string.h>

#include "engine/oai/oai_request.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    enum oai_kind kind = data[0] & 1 ? OAI_COMPLETION : OAI_CHAT;
    char err[512];
    const char *param;
    struct oai_request r;
    if (oai_request_parse(&r, kind, (const char *)data + 1, size - 1, err, sizeof err, &param)) {
        if (!err[0]) abort(); /* a refusal always says why */
    } else {
        if (kind == OAI_CHAT && (r.n_msgs < 1 || r.n_msgs > OAI_MAX_MESSAGES)) abort();
        for (int i = 0; i < r.n_msgs; i++)
            if (!r.msgs[i].role || !r.msgs[i].content) abort();
        if (kind == OAI_COMPLETION && !r.prompt && r.n_prompt_ids < 1) abort();
        if (r.n_stop > OAI_MAX_STOP || r.top_logprobs < 0 || r.top_logprobs > 20 || r.max_tokens < -1 || r.max_tokens == 0) abort();
        for (int i = 0; i < r.n_stop; i++)
            if (!r.stop[i][0]) abort();
        if ((r.set & OAI_SET_TOPP) && !(r.sp.top_p > 0 && r.sp.top_p <= 1)) abort();
        if ((r.set & OAI_SET_TEMP) && !(r.sp.temperature >= 0 && r.sp.temperature <= 2)) abort();
    }
    oai_request_free(&r);
    return 0;
}
