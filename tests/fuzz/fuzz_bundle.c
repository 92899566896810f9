/* fuzz_bundle.c - libFuzzer target: bytes read as a bundle, with the payload's checksum made right first so the fuzzer reaches the section checks; a failure has a message naming the file, a success passes the reader's checks again on its own output. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_support.h"
#include "runtime/bundle/bundle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *bytes = malloc(size + 1);
    if (!bytes) return 0;
    memcpy(bytes, data, size);
    bundle_resign(bytes, size); /* a short input stays short: the header checks see it */
    bundle_contents c;
    char err[1024] = "";
    alloy_status st = bundle_decode(bytes, size, "fuzz.alloy", &c, err, sizeof err);
    free(bytes);
    if (st) {
        if (strncmp(err, "fuzz.alloy: ", 12) != 0) fuzz_fail("error without the file's name: '%s'", err);
        return 0;
    }
    /* what was read writes and reads back */
    uint8_t *again;
    size_t len;
    if (bundle_encode(&c, &again, &len, err, sizeof err)) fuzz_fail("encode of a decoded bundle: %s", err);
    bundle_contents d;
    if (bundle_decode(again, len, "fuzz.alloy", &d, err, sizeof err)) fuzz_fail("re-encoded bundle: %s", err);
    al_free(again);
    bundle_contents_free(&d);
    bundle_contents_free(&c);
    return 0;
}
