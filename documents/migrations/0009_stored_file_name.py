"""Documents' files are stored under a random name (``documents.models.stored_file_name``), not the
uploaded one: files already stored keep theirs."""

import documents.models
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("documents", "0008_document_terms"),
    ]

    operations = [
        migrations.AlterField(
            model_name="document",
            name="file",
            field=models.FileField(max_length=500, upload_to=documents.models.stored_file_name),
        ),
    ]
