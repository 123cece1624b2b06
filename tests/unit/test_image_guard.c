/* test_image_guard.c - inputs the image fuzzer (fuzz/fuzz_image.c) found that Debian's
 * stb_image 2.27 mishandles, and the checks image_decode runs before stb sees them: a JPEG
 * Huffman table of more than 256 symbols (stb writes past its tables) and a BMP of height 0
 * (stb returns it as a decoded image). Each must be refused with a line saying why. */
#include <criterion/criterion.h>
#include <string.h>

#include "vision/image.h"

Test(image_guard, jpeg_huffman_table_over_256_symbols)
{
    /* SOI, DHT with counts 255 + 255 (510 symbols), EOI. */
    uint8_t j[2 + 4 + 17 + 2] = {0xFF, 0xD8, 0xFF, 0xC4, 0x00, 0x13, 0x00, 255, 255};
    j[sizeof j - 2] = 0xFF;
    j[sizeof j - 1] = 0xD9;
    struct image_u8 im;
    char err[256] = "";
    cr_assert_eq(image_decode(j, sizeof j, NULL, &im, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "more than 256 symbols"), "%s", err);
    /* The same table split over 256 symbols exactly passes the guard (and fails later in stb
     * as a JPEG without a frame, with stb's own reason). */
    j[7] = 128; j[8] = 128;
    err[0] = 0;
    cr_assert_eq(image_decode(j, sizeof j, NULL, &im, err, sizeof err), TIDE_EFORMAT);
    cr_assert_null(strstr(err, "more than 256 symbols"), "%s", err);
}

Test(image_guard, bmp_height_zero)
{
    /* BITMAPINFOHEADER, 4x0, 24 bits, with one row of pixel bytes after it. */
    uint8_t b[54 + 12] = {'B', 'M', sizeof b, 0, 0, 0, 0, 0, 0, 0, 54, 0, 0, 0,
                          40, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 24, 0};
    struct image_u8 im;
    char err[256] = "";
    cr_assert_eq(image_decode(b, sizeof b, NULL, &im, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "it is 4x0"), "%s", err);
}
