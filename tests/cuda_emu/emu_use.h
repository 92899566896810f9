/* emu_use.h - a cmocka test's switch to the host emulation of the device: every graph built after use_emulation() runs its "cuda" device there, and a machine without the emulation skips the test with the reason. Include after <cmocka.h>, emu_loader.h and emu_device.h. */
#ifndef ALLOY_EMU_USE_H
#define ALLOY_EMU_USE_H

/* Every graph built after this runs its "cuda" device on the emulation;
 * skips the calling test (SKIP and why) when there is none. */
static inline void use_emulation(void)
{
    char why[512];
    if (!emu_available(why, sizeof why)) {
        print_message("SKIP: no host emulation of the device: %s\n", why);
        skip();
    }
    rt_backend_set_cuda_opener(emu_backend_opener);
}

#endif
