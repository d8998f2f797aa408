/*
** fuzz_formats.h -- the quantized formats fuzz_ckpt loads checkpoints into, shared with the seed
** writer (ckpt_seeds.c): one recipe with a format of every shipped plugin and the options that
** change a storage's buffers, and the role (linear:weight:<name>) that takes each.
*/
#ifndef HQ_FUZZ_FORMATS_H
#define HQ_FUZZ_FORMATS_H

/* The shape of every qtensor "q" (MX's columnwise blocks take 32 rows; the checked-in seeds'
   fp8_tensor one, [16, 32], now only meets the shape check) */
#define FUZZ_Q_ROWS 32
#define FUZZ_Q_COLS 32

static const char fuzz_recipe_text[] =
    "[recipe]\nname = fuzz\n"
    "[format f8]\nplugin = fp8_tensor\ndtype = e4m3\n"
    "[format blk1]\nplugin = fp8_block\nblock = 1d\n"
    "[format blk2]\nplugin = fp8_block\nblock = 2d\n"
    "[format mx8]\nplugin = mxfp8\n"
    "[format nv]\nplugin = nvfp4\n"
    "[format nvrow]\nplugin = nvfp4\nglobal_scale = row\n"
    "[format nvue]\nplugin = nvfp4\nscale_dtype = ue5m3\n"
    "[format mx4]\nplugin = mxfp4\n"
    "[format mx6]\nplugin = mxfp6\nelem = e3m2\n"
    "[role *:*:*]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:weight:blk1]\nrowwise = blk1\ncolumnwise = blk1\n"
    "[role linear:weight:blk2]\nrowwise = blk2\ncolumnwise = blk2\n"
    "[role linear:weight:mx8]\nrowwise = mx8\ncolumnwise = mx8\n"
    "[role linear:weight:nv]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:weight:nvrow]\nrowwise = nvrow\ncolumnwise = nvrow\n"
    "[role linear:weight:nvue]\nrowwise = nvue\ncolumnwise = nvue\n"
    "[role linear:weight:mx4]\nrowwise = mx4\ncolumnwise = mx4\n"
    "[role linear:weight:mx6]\nrowwise = mx6\ncolumnwise = mx6\n";

/* The role names; "fc1" takes the catch-all role (fp8_tensor), as the first seeds did. */
static const char *const fuzz_role_names[] = {"fc1", "blk1",  "blk2", "mx8", "nv",
                                              "nvrow", "nvue", "mx4",  "mx6"};
#define FUZZ_NFORMATS (int)(sizeof fuzz_role_names / sizeof fuzz_role_names[0])

#endif
