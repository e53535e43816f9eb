/* Does this machine run AMX tile instructions? (packaging/bootstrap.sh)
 *
 * Some virtual machines report AMX in CPUID but fault on its first tile instruction, even after
 * the kernel granted the tile-data permission; a llama.cpp built with -march=native there dies
 * with SIGILL/SIGSEGV in its AMX matrix multiply on the first decode. Exit 0 only when the
 * permission is granted and a tile configuration loads and releases. Built with -mamx-tile. */
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <immintrin.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        return 1;
    }
    uint8_t cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;                   /* palette 1 */
    cfg[16] = 64;                 /* tile 0: 64 bytes a row ... */
    cfg[48] = 1;                  /* ... one row */
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
