/* sha256.h - SHA-256 (FIPS 180-4), incremental or in one call: the kernel cache's keys, the bundle checksum. */
#ifndef ALLOY_SHA256_H
#define ALLOY_SHA256_H

#include "base/base.h"

/* A digest in progress. */
typedef struct al_sha256_ctx {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t used;
} al_sha256_ctx;

/* Starts a digest. */
AL_HIDDEN void al_sha256_init(al_sha256_ctx *s);
/* Adds data[0..len) to it. */
AL_HIDDEN void al_sha256_update(al_sha256_ctx *s, const void *data, size_t len);
/* Pads, finishes and writes the 32-byte digest. */
AL_HIDDEN void al_sha256_final(al_sha256_ctx *s, uint8_t digest[32]);
/* The SHA-256 of data[0..len) into digest, in one call. */
AL_HIDDEN void al_sha256(const void *data, size_t len, uint8_t digest[32]);

#endif
