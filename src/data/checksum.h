/* checksum.h — CRC32C (Castagnoli), the checksum on every snapshot, replica and checkpoint.
 * Uses carry-less multiplies (VPCLMULQDQ) or the SSE4.2 crc32 instruction when the CPU has
 * them, a table otherwise; all give the same value. */
#ifndef DEADPOOL_CHECKSUM_H
#define DEADPOOL_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC32C: crc32c(crc32c(0, a), b) == crc32c(0, a||b). Start with 0. */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

/* dst[0..len) = src[0..len), returning crc32c(crc, src) computed in the same pass over the
 * data (chunk by chunk: the copy reads what the checksum just brought into cache). dst is
 * written with streaming stores: it is meant for buffers that are not read again soon. */
uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len);

/* The crc32-instruction path alone, without the VPCLMULQDQ fold (what CPUs without it run),
 * same contract as crc32c(); the software path where the CPU lacks SSE4.2. For tests. */
uint32_t crc32c_nofold(uint32_t crc, const void *data, size_t len);
/* Which path crc32c() takes on big buffers here: "fold", "sse4.2" or "software". */
const char *crc32c_path(void);

/* The table-driven software CRC32C, same contract as crc32c(): the reference
 * implementation, for tests (crc32c() uses it itself when the CPU lacks SSE4.2). */
uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len);

#endif
