"""How long a page prints: the PDF's pages in reading order and the first that draws a figure, on a PDF written
here; with Chromium installed, a real page printed on A4."""
import base64
import io
import shutil

import pytest

import _pages as pages


def _pdf(page_images: list[list[int]]) -> bytes:
    """A PDF as Chromium lays one out (a page tree, image XObjects in each page's resources): per page, the
    widths of the images it draws. The second page tree node lists its pages in reverse object order."""
    objs, kids = {}, []
    n = 10
    for widths in page_images:
        refs = []
        for w in widths:
            objs[n] = f"<</Type /XObject /Subtype /Image /Width {w} /Height 10 /Length 0>>"
            refs.append(f"/X{n} {n} 0 R")
            n += 1
        xobj = f"/XObject <<{' '.join(refs)}>>" if refs else ""
        objs[n] = f"<</Type /Page /Parent 3 0 R /Resources <<{xobj}>> /MediaBox [0 0 595 842]>>"
        kids.append(n)
        n += 1
    objs[3] = f"<</Type /Pages /Parent 2 0 R /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)}>>"
    objs[2] = f"<</Type /Pages /Kids [3 0 R] /Count {len(kids)}>>"
    objs[1] = "<</Type /Catalog /Pages 2 0 R>>"
    body = "".join(f"{k} 0 obj\n{v}\nendobj\n" for k, v in sorted(objs.items(), key=lambda kv: -kv[0]))
    return ("%PDF-1.4\n" + body + "trailer\n<</Root 1 0 R>>\n%%EOF").encode()


def test_pages_and_the_first_figure_follow_the_page_tree():
    count = pages.pdf_pages(_pdf([[], [40], [], [640, 20], [800]]))
    assert count.pages == 5 and count.first_figure == 4  # page 2's 40 px image is an icon, not a figure
    assert pages.pdf_pages(_pdf([[], []])).first_figure is None


def test_no_chromium_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="apt-get install -y chromium"):
        pages.find_chromium()


@pytest.mark.skipif(not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")),
                    reason="no Chromium to print with")
def test_a_page_prints_on_a4_with_its_figure_where_it_stands():
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (600, 300), "teal").save(png, format="PNG")
    img = f"<img src='data:image/png;base64,{base64.b64encode(png.getvalue()).decode()}'>"
    filler = "".join(f"<p>paragraph {i} of a long page</p>" for i in range(120))
    count = pages.page_count(f"<html><head></head><body>{filler}{img}</body></html>")
    assert count.pages >= 3 and count.first_figure == count.pages  # the figure comes last
    assert pages.page_count("<html><body><p>one line</p></body></html>").pages == 1
