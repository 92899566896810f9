/* checksum.c - CRC-32 (slicing by eight) and the checksum of a set of tensors (checkpoint metadata). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/checksum.h"

void io_crc_init(io_crc *c)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t r = i;
        for (int k = 0; k < 8; k++) r = r & 1 ? (r >> 1) ^ 0xedb88320u : r >> 1;
        c->table[0][i] = r;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            c->table[t][i] = (c->table[t - 1][i] >> 8) ^ c->table[0][c->table[t - 1][i] & 0xff];
    c->crc = 0xffffffffu;
}

void io_crc_add(io_crc *c, const void *p, size_t n)
{
    const unsigned char *b = p;
    uint32_t r = c->crc;
    uint32_t(*t)[256] = c->table;
    for (; n >= 8; n -= 8, b += 8) {
        uint32_t lo = r ^ ((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
        r = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][b[4]] ^
            t[2][b[5]] ^ t[1][b[6]] ^ t[0][b[7]];
    }
    while (n--) r = (r >> 8) ^ t[0][(r ^ *b++) & 0xff];
    c->crc = r;
}

uint32_t io_crc_value(const io_crc *c) { return c->crc ^ 0xffffffffu; }

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp((*(const alloy_host_tensor *const *)a)->name, (*(const alloy_host_tensor *const *)b)->name);
}

alloy_status io_tensors_checksum(const alloy_host_tensor *const *tensors, int n, char out[IO_CHECKSUM_LEN])
{
    const alloy_host_tensor **order = al_malloc(sizeof *order * (size_t)(n > 0 ? n : 1));
    if (!order) return ALLOY_ERR_OOM;
    if (n > 0) memcpy(order, tensors, sizeof *order * (size_t)n);
    qsort(order, (size_t)(n > 0 ? n : 0), sizeof *order, cmp_by_name);
    io_crc c; /* 8 KiB of tables */
    io_crc_init(&c);
    for (int i = 0; i < n; i++) {
        const alloy_host_tensor *t = order[i];
        char head[64], dims[8 * 21 + 1] = "";
        const char *dt = alloy_dtype_name(t->dtype);
        size_t k = 0;
        for (; dt[k] && k < sizeof head - 1; k++) head[k] = (char)toupper((unsigned char)dt[k]);
        head[k] = '\0';
        for (int d = 0; d < t->rank; d++)
            al_fmt(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? "," : "", (long long)t->dims[d]);
        io_crc_add(&c, t->name, strlen(t->name) + 1);
        io_crc_add(&c, head, strlen(head) + 1);
        io_crc_add(&c, dims, strlen(dims) + 1);
        int64_t numel = alloy_host_tensor_numel(t);
        if (numel > 0) io_crc_add(&c, t->data, (size_t)numel * alloy_dtype_size(t->dtype));
    }
    al_fmt(out, IO_CHECKSUM_LEN, "crc32:%08x", io_crc_value(&c));
    al_free(order);
    return ALLOY_OK;
}
